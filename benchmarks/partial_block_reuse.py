"""Does partial-block reuse by copy-on-write pay? (BlockAllocator.match_prefix_partial)

vLLM and SGLang (with page size > 1) reuse only whole cached blocks: when a new prompt diverges
from a cached one inside a block, the matching tokens of that block are recomputed. pagedkv can
instead copy the cached block into a fresh one and prefill from the divergence point. This
script measures both sides of the trade:

1. savings (CPU, the real allocator): prefill tokens with match_prefix vs match_prefix_partial
   on request streams that share prefixes, and the block copies it costs;
2. cost (torch device, cuda if present): one KV block copy (all layers, one index op, as a
   copy_blocks kernel would) vs. the marginal prefill time per token of a decoder stack with the
   model's shapes (random bf16 weights; GEMMs + SDPA, i.e. the work a prefill token costs).

    python benchmarks/partial_block_reuse.py [--cost | --cost-only] [--block-size 16]
"""

from __future__ import annotations

import argparse
import random
import time

# name: (layers, hidden, q heads, kv heads, head size, mlp)
MODELS = {
    "SmolLM2-135M": (30, 576, 9, 3, 64, 1536),
    "Llama-3-8B": (32, 4096, 32, 8, 128, 14336),
}


# ---- 1. savings -------------------------------------------------------------------------------
def stream(kind: str, rng: random.Random, n: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, generated tokens) per request. shared_system: 8 system prompts (100..2000
    tokens) + distinct questions (16..256). resend: every prompt sent twice (retries, n > 1 as
    separate requests); the first copy's blocks are cached with its generated tokens, so the
    resent prompt's last tokens lie inside a cached block. multi_turn: each turn's prompt is the
    previous prompt + its answer + a new message."""

    def toks(k: int) -> list[int]:
        return [rng.randrange(1000, 50000) for _ in range(k)]

    if kind == "shared_system":
        systems = [toks(rng.randrange(100, 2000)) for _ in range(8)]
        return [(rng.choice(systems) + toks(rng.randrange(16, 256)), toks(64)) for _ in range(n)]
    if kind == "resend":
        base = [toks(rng.randrange(50, 1500)) for _ in range(n // 2)]
        return [(p, toks(64)) for p in base] + [(list(p), toks(64)) for p in base]
    out: list[tuple[list[int], list[int]]] = []
    convo = toks(200)
    for _ in range(n):
        convo = convo + toks(rng.randrange(10, 100))
        answer = toks(64)
        out.append((list(convo), answer))
        convo = convo + answer
    return out


def run_stream(
    reqs: list[tuple[list[int], list[int]]], bs: int, partial: bool
) -> tuple[int, int, int]:
    """(prefill tokens, total prompt tokens, block copies) through the allocator: each request
    is prefilled, generates its tokens, has its full blocks cached (as the scheduler does) and
    is freed. A large pool: no evictions."""
    from pagedkv import BlockAllocator

    a = BlockAllocator(1 << 16, bs)
    prefill = total = 0
    for p, gen in reqs:
        if partial:
            ids, k = a.match_prefix_partial(p, max_tokens=len(p) - 1)
        else:
            ids = a.match_prefix(p, max_blocks=(len(p) - 1) // bs)
            k = len(ids) * bs
        seq = p + gen
        ids += a.allocate(-(-len(seq) // bs) - len(ids))
        prefill += len(p) - k
        total += len(p)
        parent = None
        for i in range(len(seq) // bs):
            parent = a.cache_full_block(ids[i], parent, seq[i * bs : (i + 1) * bs])
        a.free(ids)
    return prefill, total, a.stats()["cow_copies"]


def savings(bs: int) -> dict[str, tuple[float, float]]:
    """kind -> (prefill tokens saved per request, block copies per request)."""
    out = {}
    print(f"\n## Savings (block_size={bs})")
    print(
        "| stream | requests | prompt tokens | prefill (full blocks) | prefill (+partial) "
        "| saved | saved/request | copies/request |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for kind in ("shared_system", "resend", "multi_turn"):
        reqs = stream(kind, random.Random(0), 400)
        full, total, _ = run_stream(reqs, bs, partial=False)
        part, _, copies = run_stream(reqs, bs, partial=True)
        n = len(reqs)
        out[kind] = ((full - part) / n, copies / n)
        print(
            f"| {kind} | {n} | {total} | {full} | {part} | {(full - part) / full:.1%} "
            f"| {(full - part) / n:.2f} | {copies / n:.2f} |"
        )
    return out


# ---- 2. cost ----------------------------------------------------------------------------------
def layer_time(torch, dev, shape, tokens: int, iters: int) -> float:
    """Seconds for one decoder layer's prefill of `tokens` tokens (bf16, random weights)."""
    import torch.nn.functional as F

    _, hidden, qh, kvh, hd, mlp = shape
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    w_qkv = torch.randn(hidden, (qh + 2 * kvh) * hd, device=dev, dtype=dt) * 0.02
    w_o = torch.randn(qh * hd, hidden, device=dev, dtype=dt) * 0.02
    w_up = torch.randn(hidden, 2 * mlp, device=dev, dtype=dt) * 0.02
    w_down = torch.randn(mlp, hidden, device=dev, dtype=dt) * 0.02
    x = torch.randn(tokens, hidden, device=dev, dtype=dt)

    def layer() -> object:
        qkv = x @ w_qkv
        q, k, v = qkv.split([qh * hd, kvh * hd, kvh * hd], dim=-1)
        q = q.view(tokens, qh, hd).transpose(0, 1)
        k = k.view(tokens, kvh, hd).transpose(0, 1).repeat_interleave(qh // kvh, 0)
        v = v.view(tokens, kvh, hd).transpose(0, 1).repeat_interleave(qh // kvh, 0)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = x + o.transpose(0, 1).reshape(tokens, qh * hd) @ w_o
        g, u = (h @ w_up).chunk(2, dim=-1)
        return h + (F.silu(g) * u) @ w_down

    return timed(torch, dev, layer, iters)


def timed(torch, dev, fn, iters: int) -> float:
    fn()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / iters)
    return best


def copy_time(torch, dev, shape, bs: int, n_copies: int, iters: int) -> float:
    """Seconds to copy n_copies blocks in every layer's K and V with one index op."""
    layers, _, _, kvh, hd, _ = shape
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    num_blocks = 512
    kv = torch.zeros(layers, 2, num_blocks, bs, kvh, hd, device=dev, dtype=dt)
    src = torch.arange(n_copies, device=dev)
    dst = src + num_blocks // 2

    def copy() -> None:
        kv[:, :, dst] = kv[:, :, src]

    return timed(torch, dev, copy, iters)


def cost(bs: int, saved: dict[str, tuple[float, float]]) -> None:
    import torch

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(0) if dev.type == "cuda" else "CPU"
    print(f"\n## Cost on {name} (block_size={bs})")
    print(
        "| model | KV bytes/block | copy 1 block (us) | copy 64 blocks (us) "
        "| prefill us/token (marginal) | break-even tokens/copy |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    results = {}
    for model, shape in MODELS.items():
        layers, _, _, kvh, hd, _ = shape
        iters = 50 if dev.type == "cuda" else 2
        lo, hi = (1024, 2048) if dev.type == "cuda" else (128, 256)
        t_lo = layer_time(torch, dev, shape, lo, iters)
        t_hi = layer_time(torch, dev, shape, hi, iters)
        per_token = layers * (t_hi - t_lo) / (hi - lo)
        c1 = copy_time(torch, dev, shape, bs, 1, iters * 4)
        c64 = copy_time(torch, dev, shape, bs, 64, iters * 4)
        elt = 2 if dev.type == "cuda" else 4
        results[model] = (per_token, c1, c64)
        print(
            f"| {model} | {layers * 2 * bs * kvh * hd * elt:,} | {c1 * 1e6:.1f} | "
            f"{c64 * 1e6:.1f} | {per_token * 1e6:.2f} | {c1 / per_token:.2f} |"
        )
    print("\n## Net effect per request (saved prefill time - copy time, one copy each)")
    print("| model | stream | saved tokens/request | saved us | copy us (1 block) | net us |")
    print("|---|---|---:|---:|---:|---:|")
    for model, (per_token, c1, _) in results.items():
        for kind, (tok, copies) in saved.items():
            gain = tok * per_token
            spend = copies * c1
            print(
                f"| {model} | {kind} | {tok:.2f} | {gain * 1e6:.1f} | {spend * 1e6:.1f} | "
                f"{(gain - spend) * 1e6:+.1f} |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    ap.add_argument(
        "--cost",
        action="store_true",
        help="also measure copy vs prefill cost with torch (cuda if available)",
    )
    ap.add_argument(
        "--cost-only",
        action="store_true",
        help="only the cost part (needs torch, not pagedkv: for a GPU machine)",
    )
    args = ap.parse_args()
    saved = {} if args.cost_only else savings(args.block_size)
    if args.cost or args.cost_only:
        cost(args.block_size, saved)


if __name__ == "__main__":
    main()
