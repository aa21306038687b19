"""CPU paged attention: pagedkv's kernels vs torch (gather K/V from the paged cache + SDPA).

Both sides compute the same thing from the same paged cache, in the same run and with the same
number of threads: decode (one query token per sequence, `forward_decode`) and prefill (new
tokens attending causally to a cached prefix and themselves, `forward_prefix`). The torch peer
gathers each sequence's blocks with advanced indexing (NHD layout, the cheapest for it) and
calls `torch.nn.functional.scaled_dot_product_attention` with GQA.

    python benchmarks/cpu_ops.py [--quick] [--threads N]
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Callable

import torch
import torch.nn.functional as F
from pagedkv import PagedAttention


def bench(fn: Callable[[], object], min_time: float = 0.3, warmup: int = 2) -> float:
    """Median seconds per call."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < min_time or len(times) < 5:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def make_cache(
    num_seqs: int, ctx: int, block_size: int, kvh: int, d: int, dtype: torch.dtype, layout: str
) -> tuple:
    blocks_per_seq = (ctx + block_size - 1) // block_size
    nb = num_seqs * blocks_per_seq + 1
    g = torch.Generator().manual_seed(0)
    k = torch.randn(nb, block_size, kvh, d, generator=g).to(dtype)
    v = torch.randn(nb, block_size, kvh, d, generator=g).to(dtype)
    tables = (
        torch.randperm(nb - 1, generator=g)[: num_seqs * blocks_per_seq]
        .view(num_seqs, blocks_per_seq)
        .to(torch.int32)
    )
    if layout == "vllm":
        x = 16 // k.element_size()
        kc = k.view(nb, block_size, kvh, d // x, x).permute(0, 2, 3, 1, 4).contiguous()
        vc = v.permute(0, 2, 3, 1).contiguous()
    else:
        kc, vc = k, v
    return k, v, kc, vc, tables


def torch_gather(cache: torch.Tensor, tables: torch.Tensor, n: int) -> torch.Tensor:
    """NHD cache [nb, bs, kvh, d] -> [seqs, kvh, n, d] for the first n tokens."""
    s = tables.shape[0]
    g = cache[tables.long()]  # [s, blocks, bs, kvh, d]
    return g.reshape(s, -1, cache.shape[2], cache.shape[3])[:, :n].transpose(1, 2)


def decode_row(
    num_seqs: int, ctx: int, h: int, kvh: int, d: int, dtype: torch.dtype, layout: str, bs: int = 16
) -> tuple:
    k, v, kc, vc, tables = make_cache(num_seqs, ctx, bs, kvh, d, dtype, layout)
    q = torch.randn(num_seqs, h, d).to(dtype)
    seq_lens = torch.full((num_seqs,), ctx, dtype=torch.int32)
    scale = 1.0 / math.sqrt(d)

    def ours() -> torch.Tensor:
        return PagedAttention.forward_decode(
            q, kc, vc, tables, seq_lens, ctx, "auto", kvh, scale, None, 1.0, 1.0
        )

    def peer() -> torch.Tensor:
        kk, vv = torch_gather(k, tables, ctx), torch_gather(v, tables, ctx)
        o = F.scaled_dot_product_attention(q.unsqueeze(2), kk, vv, scale=scale, enable_gqa=True)
        return o.squeeze(2)

    err = (ours().float() - peer().float()).norm() / peer().float().norm()
    return bench(ours), bench(peer), float(err)


def prefill_row(
    num_seqs: int,
    ctx: int,
    new: int,
    h: int,
    kvh: int,
    d: int,
    dtype: torch.dtype,
    layout: str,
    bs: int = 16,
) -> tuple:
    k, v, kc, vc, tables = make_cache(num_seqs, max(ctx, 1), bs, kvh, d, dtype, layout)
    t = num_seqs * new
    q = torch.randn(t, h, d).to(dtype)
    kn = torch.randn(t, kvh, d).to(dtype)
    vn = torch.randn(t, kvh, d).to(dtype)
    qsl = torch.arange(0, t + 1, new, dtype=torch.int32)
    seq_lens = torch.full((num_seqs,), ctx + new, dtype=torch.int32)
    scale = 1.0 / math.sqrt(d)
    # Query i (position ctx + i) sees keys 0 .. ctx + i.
    mask = torch.ones(new, ctx + new, dtype=torch.bool).tril(diagonal=ctx)

    def ours() -> torch.Tensor:
        return PagedAttention.forward_prefix(
            q, kn, vn, "auto", kc, vc, tables, qsl, seq_lens, new, None, None, 1.0, 1.0, scale=scale
        )

    def peer() -> torch.Tensor:
        qq = q.view(num_seqs, new, h, d).transpose(1, 2)
        knn = kn.view(num_seqs, new, kvh, d).transpose(1, 2)
        vnn = vn.view(num_seqs, new, kvh, d).transpose(1, 2)
        if ctx:
            kk = torch.cat([torch_gather(k, tables, ctx), knn], dim=2)
            vv = torch.cat([torch_gather(v, tables, ctx), vnn], dim=2)
            o = F.scaled_dot_product_attention(
                qq, kk, vv, attn_mask=mask, scale=scale, enable_gqa=True
            )
        else:
            o = F.scaled_dot_product_attention(
                qq, knn, vnn, is_causal=True, scale=scale, enable_gqa=True
            )
        return o.transpose(1, 2).reshape(t, h, d)

    err = (ours().float() - peer().float()).norm() / peer().float().norm()
    return bench(ours), bench(peer), float(err)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer, smaller cases")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (set PAGEDKV_NUM_THREADS for pagedkv; default: all)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from pagedkv import _C

    print(
        f"threads: pagedkv {_C.ops_num_threads()}, torch {torch.get_num_threads()}; "
        f"torch {torch.__version__}"
    )
    hdr = (
        f"{'case':<44} {'layout':<6} {'dtype':<9} {'pagedkv ms':>10} {'torch ms':>9} "
        f"{'speedup':>8} {'rel err':>8}"
    )
    print(hdr)
    print("-" * len(hdr))
    dtypes = (
        [torch.float32, torch.bfloat16]
        if args.quick
        else [torch.float32, torch.float16, torch.bfloat16]
    )
    decode_cases = [(8, 1024, 32, 8, 128), (32, 512, 9, 3, 64)]
    prefill_cases = [(1, 0, 512, 32, 8, 128), (2, 1024, 128, 9, 3, 64)]
    if not args.quick:
        decode_cases += [(4, 4096, 32, 8, 128), (64, 256, 32, 32, 128)]
        prefill_cases += [(1, 0, 1024, 9, 3, 64)]
    for dtype in dtypes:
        dn = str(dtype).split(".")[-1]
        for s, ctx, h, kvh, d in decode_cases:
            for layout in ("nhd", "vllm"):
                ours, peer, err = decode_row(s, ctx, h, kvh, d, dtype, layout)
                name = f"decode seqs={s} ctx={ctx} h={h}/{kvh} d={d}"
                print(
                    f"{name:<44} {layout:<6} {dn:<9} {ours * 1e3:>10.3f} {peer * 1e3:>9.3f} "
                    f"{peer / ours:>7.2f}x {err:>8.1e}"
                )
        for s, ctx, new, h, kvh, d in prefill_cases:
            for layout in ("nhd", "vllm"):
                ours, peer, err = prefill_row(s, ctx, new, h, kvh, d, dtype, layout)
                name = f"prefill seqs={s} ctx={ctx} new={new} h={h}/{kvh} d={d}"
                print(
                    f"{name:<44} {layout:<6} {dn:<9} {ours * 1e3:>10.3f} {peer * 1e3:>9.3f} "
                    f"{peer / ours:>7.2f}x {err:>8.1e}"
                )


if __name__ == "__main__":
    main()
