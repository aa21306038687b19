"""GPU paged attention vs contiguous torch SDPA (cuDNN / FlashAttention backends), gather + SDPA
and the card's copy bandwidth. One run prints one table.

    python benchmarks/gpu_attention.py [--quick] [--skewed | --skewed-only]

--skewed adds decode batches of Zipf-skewed lengths (the work-balanced decode against the
split-K and FlashAttention-2 varlen) and the cascade (shared-prefix) decode table.

Decode, causal prefill, extend (new tokens over a cached prefix: chunked prefill, prefix reuse)
and reshape_and_cache.

bf16, Hq=32, Hkv=8, D=128, block 16, NHD cache with randomly permuted blocks. Times are medians
of CUDA-graph replays (each replay runs the op over several rotating buffer sets whose total
size exceeds the L2 cache, so every call reads from HBM), after warm-up; each replay is queued
behind a GPU-side spin, so the host's graph submission is not timed (--host-latency times it).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import math
import os
import random
import statistics
from typing import Callable, Iterator, Optional

import pagedkv
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

HQ, HKV, D, BS = 32, 8, 128, 16
DTYPE = torch.bfloat16
ROTATE_BYTES = 256 << 20  # buffers cycled per replay: > 50 MB of L2
DECODE_SHAPES = [(1, 4096), (1, 32768), (16, 4096), (64, 2048), (256, 512), (32, 8192)]
PREFILL_SHAPES = [(1, 8192), (8, 2048), (32, 512)]
# Extend (chunked prefill / prefix reuse): (sequences, cached prefix tokens, new tokens).
EXTEND_SHAPES = [(1, 7168, 1024), (8, 1536, 512), (32, 384, 128)]


ops = pagedkv.ops


# GPU cycles (~100 us on an H100) spun before each timed replay, so that the host has queued the
# start event, the replay and the end event before the GPU reaches them: the time between the
# events is then the GPU's, not the host's graph submission (10-20 us per replay otherwise,
# measured with one tiny kernel; RESULTS.md). Zero: the queue is empty at the start event.
QUEUE_AHEAD_CYCLES = 200_000


def time_graph(calls: list[Callable[[], None]], reps: int = 15) -> float:
    """Median seconds per call: the calls are captured once in a CUDA graph and replayed, each
    replay queued behind a GPU-side spin (QUEUE_AHEAD_CYCLES)."""
    for c in calls:  # warm-up (also triggers lazy init outside the capture)
        c()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        for c in calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if QUEUE_AHEAD_CYCLES:
            torch.cuda._sleep(QUEUE_AHEAD_CYCLES)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / len(calls))
    return statistics.median(times)


def try_time(make: Callable[[], list[Callable[[], None]]]) -> Optional[float]:
    try:
        return time_graph(make())
    except Exception as e:  # a backend that refuses the shape is reported as n/a
        print(f"    (n/a: {type(e).__name__}: {str(e).splitlines()[0][:90]})")
        return None


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second."""
    n = 1 << 28  # 512 MiB of bf16
    a = torch.empty(n, dtype=DTYPE, device="cuda").normal_()
    b = torch.empty_like(a)
    t = time_graph([lambda: b.copy_(a)] * 4)
    return 2 * a.numel() * a.element_size() / t


def _probe(num_seqs: int, kv_dtype: str = "auto") -> tuple:
    """A query and a one-block NHD cache of this benchmark's dtypes and head counts: what the
    library's kernel and split-K choices depend on (they read shapes, never values)."""
    q = torch.empty(num_seqs, HQ, D, dtype=DTYPE, device="cuda")
    cdt = DTYPE if kv_dtype == "auto" else torch.uint8
    return q, torch.empty(1, BS, HKV, D, dtype=cdt, device="cuda")


def _kernel_kw(kernel: str) -> dict:
    """The ops' kernel argument, left out for "auto" and for builds from before it (which take
    the choice from the environment: _old_build_decode_kernel)."""
    return {} if kernel == "auto" or not _takes_kernel() else {"kernel": kernel}


# How builds from before the kernel argument were told which decode kernel to run (read per
# call, so the setting holds for the calls captured inside): A/B runs time both sides.
_OLD_DECODE_ENV = {
    "hopper": {"PAGEDKV_DECODE_BULK": "2"},
    "tensor_core": {"PAGEDKV_DECODE_BULK": "0", "PAGEDKV_DECODE_MMA": "1"},
    "cuda_core": {"PAGEDKV_DECODE_BULK": "0", "PAGEDKV_DECODE_MMA": "0"},
}


def _old_build_decode_kernel(kernel: str) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    if kernel != "auto" and not _takes_kernel():
        for name, value in _OLD_DECODE_ENV[kernel].items():
            stack.enter_context(_env(name, value))
    return stack


def decode_partition(
    num_seqs: int, max_len: int, sms: int, kv_dtype: str = "auto", kernel: str = "auto"
) -> int:
    """The library's split-K choice (what PagedAttention.forward_decode uses on CUDA) for this
    benchmark's bf16 queries over an NHD cache, on `kernel`."""
    q, cache = _probe(num_seqs, kv_dtype)
    return ops.decode_partition_size(q, cache, cache, HKV, max_len, kv_dtype, **_kernel_kw(kernel))


def make_cache(num_seqs: int, seq_len: int, kv_dtype: str = "auto"):
    nblk = math.ceil(seq_len / BS)
    nb = num_seqs * nblk
    if kv_dtype == "auto":
        kc = torch.randn(nb, BS, HKV, D, dtype=DTYPE, device="cuda")
        vc = torch.randn(nb, BS, HKV, D, dtype=DTYPE, device="cuda")
    else:
        kc = torch.randn(nb, BS, HKV, D, device="cuda").to(torch.float8_e4m3fn).view(torch.uint8)
        vc = torch.randn(nb, BS, HKV, D, device="cuda").to(torch.float8_e4m3fn).view(torch.uint8)
    tables = torch.randperm(nb, device="cuda", dtype=torch.int32).view(num_seqs, nblk)
    return kc, vc, tables


def _decode_inputs(b: int, length: int, sms: int, kv_dtype: str, kernel: str = "auto") -> dict:
    kv_bytes = 2 * b * length * HKV * D * (2 if kv_dtype == "auto" else 1)
    n_sets = max(1, min(8, ROTATE_BYTES // kv_bytes))
    ps = decode_partition(b, length, sms, kv_dtype, kernel)
    parts = math.ceil(length / ps) if ps else 1
    es = torch.empty(b, HQ, parts, device="cuda")
    return {
        "caches": [make_cache(b, length, kv_dtype) for _ in range(n_sets)],
        "q": torch.randn(b, HQ, D, dtype=DTYPE, device="cuda"),
        "sl": torch.full((b,), length, dtype=torch.int32, device="cuda"),
        "ps": ps,
        "es": es,
        "ml": torch.empty_like(es),
        "tmp": torch.empty(b, HQ, parts, D, device="cuda"),
        "bytes": kv_bytes,
        "kernel": kernel,
    }


def decode_calls(x: dict, length: int, kv_dtype: str) -> list[Callable[[], None]]:
    """Our decode on _decode_inputs' data, one call per cache set (v2 where it splits)."""
    q, sl, ps, kw = x["q"], x["sl"], x["ps"], _kernel_kw(x["kernel"])
    out = torch.empty_like(q)

    def ours(kc, vc, bt):
        args = (q, kc, vc, HKV, D**-0.5, bt, sl, BS, length, None, kv_dtype, 1.0, 1.0)
        if ps:
            return lambda: ops.paged_attention_v2(
                out, x["es"], x["ml"], x["tmp"], *args, partition_size=ps, **kw
            )
        return lambda: ops.paged_attention_v1(out, *args, **kw)

    return [ours(*c) for c in x["caches"]]


def contiguous_kv(kc, vc, bt, b: int, length: int) -> tuple:
    """A paged cache's keys and values laid out contiguously, [b, hkv, length, d]."""
    k = kc[bt.long()].reshape(b, -1, HKV, D)[:, :length].transpose(1, 2).contiguous()
    v = vc[bt.long()].reshape(b, -1, HKV, D)[:, :length].transpose(1, 2).contiguous()
    return k, v


def _time_ours(x: dict, length: int, kv_dtype: str) -> float:
    return time_graph(decode_calls(x, length, kv_dtype))


def bench_decode_ours(
    b: int, length: int, sms: int, kv_dtype: str = "auto", kernel: str = "auto"
) -> float:
    """Seconds per call of our decode alone (on `kernel`)."""
    with _old_build_decode_kernel(kernel):
        return _time_ours(_decode_inputs(b, length, sms, kv_dtype, kernel), length, kv_dtype)


def bench_decode(b: int, length: int, sms: int, kv_dtype: str = "auto") -> dict:
    x = _decode_inputs(b, length, sms, kv_dtype)
    caches, q, kv_bytes = x["caches"], x["q"], x["bytes"]
    res = {"ours": _time_ours(x, length, kv_dtype), "bytes": kv_bytes, "ps": x["ps"]}
    if kv_dtype != "auto":
        return res
    qs = q.view(b, HQ, 1, D)
    contig = [contiguous_kv(kc, vc, bt, b, length) for kc, vc, bt in caches]

    def sdpa(backend):
        def make():
            def call(k, v):
                def f():
                    with sdpa_kernel(backend):
                        F.scaled_dot_product_attention(qs, k, v, enable_gqa=True)

                return f

            return [call(k, v) for k, v in contig]

        return make

    res["cudnn"] = try_time(sdpa(SDPBackend.CUDNN_ATTENTION))
    res["flash"] = try_time(sdpa(SDPBackend.FLASH_ATTENTION))

    def gather_make():
        def call(kc, vc, bt):
            def f():
                k = kc[bt.long()].view(b, -1, HKV, D).transpose(1, 2)
                v = vc[bt.long()].view(b, -1, HKV, D).transpose(1, 2)
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    F.scaled_dot_product_attention(qs, k, v, enable_gqa=True)

            return f

        return [call(*c) for c in caches]

    res["gather"] = try_time(gather_make)
    return res


# Skewed batches: lengths L_i ~ 1 / i^s scaled to a mean of SKEW_MEAN, shuffled (s = 0: uniform).
SKEW_BATCHES = [16, 64, 128, 256]
SKEW_EXPONENTS = [0.0, 1.0, 1.5]
SKEW_MEAN = 1024
WAVES = (1, 2, 4)  # balanced plans timed: target items in waves of the resident CTAs


def zipf_lengths(b: int, s: float, mean: int = SKEW_MEAN, seed: int = 0) -> list[int]:
    w = [1.0 / (i + 1) ** s for i in range(b)]
    total = sum(w)
    lens = [max(1, round(x / total * mean * b)) for x in w]
    random.Random(seed).shuffle(lens)
    return lens


def _skew_cache(lens: list[int]) -> tuple:
    """One NHD cache holding every sequence's blocks, randomly permuted; tables padded with 0."""
    need = [math.ceil(n / BS) for n in lens]
    nb = sum(need)
    kc = torch.randn(nb, BS, HKV, D, dtype=DTYPE, device="cuda")
    vc = torch.randn(nb, BS, HKV, D, dtype=DTYPE, device="cuda")
    perm = torch.randperm(nb, device="cuda", dtype=torch.int32)
    bt = torch.zeros(len(lens), max(need), dtype=torch.int32, device="cuda")
    pos = 0
    for i, n in enumerate(need):
        bt[i, :n] = perm[pos : pos + n]
        pos += n
    return kc, vc, bt


def bench_skewed(b: int, s: float, sms: int) -> dict:
    """One skewed batch: ours on the library's choice (forward_decode's "auto" rule with the host
    lengths), the previous split-K (partition rule) alone, the balanced plan at 1, 2 and 4 waves
    of work items, FA2 varlen on the same keys packed contiguously; max |ours - FA2|."""
    from pagedkv.balanced_decode import TARGET_WAVES, BalancedDecode, prefers_balanced

    lens = zipf_lengths(b, s)
    max_len, total = max(lens), sum(lens)
    kv_bytes = 2 * total * HKV * D * 2
    n_sets = max(1, min(8, ROTATE_BYTES // kv_bytes))
    caches = [_skew_cache(lens) for _ in range(n_sets)]
    q = torch.randn(b, HQ, D, dtype=DTYPE, device="cuda")
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    ps = decode_partition(b, max_len, sms)
    parts = math.ceil(max_len / ps) if ps else 1
    es = torch.empty(b, HQ, parts, device="cuda")
    ml, tmp = torch.empty_like(es), torch.empty(b, HQ, parts, D, device="cuda")

    def split(kc, vc, bt):
        args = (q, kc, vc, HKV, D**-0.5, bt, sl, BS, max_len, None, "auto", 1.0, 1.0)
        if ps:
            return lambda: ops.paged_attention_v2(out, es, ml, tmp, *args, partition_size=ps)
        return lambda: ops.paged_attention_v1(out, *args)

    per_wave = ops.balanced_decode_target(q, caches[0][0], caches[0][1], HKV)
    plans = {}
    for waves in WAVES:
        plan = BalancedDecode(b, HQ, D, per_wave * waves, "cuda")
        plan.fill(lens)
        plans[waves] = plan

    def balanced(plan):
        def make(kc, vc, bt):
            return lambda: plan.run(out, q, kc, vc, HKV, D**-0.5, bt, sl, max_len)

        return [make(*c) for c in caches]

    ours = plans[TARGET_WAVES]
    res = {"bytes": kv_bytes, "ps": ps, "pieces": ours.used}
    res["split"] = time_graph([split(*c) for c in caches])
    for waves in WAVES:
        res[f"bal{waves}"] = time_graph(balanced(plans[waves]))
    # The balanced launch on one item per sequence: the single pass's work plus the plan's
    # machinery (partials, reduction), what a graph captured on the balanced path costs where
    # the pieces do not win.
    whole = BalancedDecode(b, HQ, D, per_wave * TARGET_WAVES, "cuda")
    whole.fill(lens, whole=True)
    res["whole"] = time_graph(balanced(whole))
    use = prefers_balanced(lens, ps, ours.items_host.numpy(), ours.used)
    res["auto"] = res[f"bal{TARGET_WAVES}"] if use else res["split"]
    res["auto_is"] = "bal" if use else ("v2" if ps else "v1")
    # FA2 varlen over the same keys packed contiguously ([total, HKV, D]).
    kc, vc, bt = caches[0]
    ks, vs = [], []
    for i, n in enumerate(lens):
        blocks = bt[i, : math.ceil(n / BS)].long()
        ks.append(kc[blocks].reshape(-1, HKV, D)[:n])
        vs.append(vc[blocks].reshape(-1, HKV, D)[:n])
    k, v = torch.cat(ks), torch.cat(vs)
    cu_k = torch.zeros(b + 1, dtype=torch.int32, device="cuda")
    cu_k[1:] = torch.cumsum(sl, 0)
    cu_q = torch.arange(b + 1, dtype=torch.int32, device="cuda")

    def fa2():
        return torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, 1, max_len, 0.0, False, False, scale=D**-0.5
        )[0]

    res["fa2"] = try_time(lambda: [fa2])
    ours.run(out, q, kc, vc, HKV, D**-0.5, bt, sl, max_len)
    ref = fa2() if res["fa2"] is not None else None
    res["err"] = None if ref is None else float((out.float() - ref.float()).abs().max())
    return res


def print_skewed(sms: int, bw: float, quick: bool) -> None:
    print(
        f"\nSkewed decode batches (lengths ~ 1/i^s, mean {SKEW_MEAN}, shuffled; us; KV bytes "
        "read / time vs copy BW)\n  ours = the library's choice (auto: which), split = the "
        "previous split-K alone, bal1 / bal2 / bal4 = the balanced plan at 1 / 2 / 4 waves of "
        "work items (the library's: TARGET_WAVES), bal v1 = the balanced launch on one item per "
        "sequence; items = the library's plan's"
    )
    print(
        f"{'B':>4} {'s':>4} {'max L':>6} {'split':>6} {'auto':>4} {'ours':>9} {'split':>9} "
        f"{'bal1':>9} {'bal2':>9} {'bal4':>9} {'bal v1':>9} {'FA2 var':>9} {'vs split':>8} "
        f"{'vs FA2':>7} "
        f"{'TB/s':>6} {'of copy':>7} {'split of':>8} {'items':>6} {'max err':>8}"
    )
    for b in SKEW_BATCHES[:2] if quick else SKEW_BATCHES:
        for s in SKEW_EXPONENTS:
            r = bench_skewed(b, s, sms)
            tbs = r["bytes"] / r["auto"]
            err = "n/a" if r["err"] is None else f"{r['err']:8.4f}"
            print(
                f"{b:>4} {s:>4} {max(zipf_lengths(b, s)):>6} {r['ps']:>6} {r['auto_is']:>4} "
                f"{fmt(r['auto'])} {fmt(r['split'])} {fmt(r['bal1'])} {fmt(r['bal2'])} "
                f"{fmt(r['bal4'])} {fmt(r['whole'])} "
                f"{fmt(r['fa2'])} {ratio(r['split'], r['auto']):>8} "
                f"{ratio(r['fa2'], r['auto']):>7} {tbs / 1e12:6.2f} {tbs / bw:7.2f} "
                f"{r['bytes'] / r['split'] / bw:8.2f} {r['pieces']:>6} {err:>8}"
            )
            torch.cuda.empty_cache()


# Cascade: sequences x (shared prefix + own keys).
# The last two: the low end of the engine's rule (pagedkv.cascade.shared_prefix_blocks).
CASCADE_SHAPES = [(64, 8192, 256), (16, 8192, 256), (64, 2048, 128), (8, 1024, 64), (4, 256, 32)]


def bench_cascade(b: int, prefix: int, own: int, sms: int) -> dict:
    """b sequences sharing `prefix` cached keys (the same blocks), each with `own` more: the
    plain decode over each whole context (the library's split-K) vs pagedkv.cascade (the prefix
    attended once for all, merged with each own part); max |cascade - plain|."""
    from pagedkv.cascade import CascadeDecode

    pb, ob = prefix // BS, math.ceil(own / BS)
    nb = pb + b * ob
    kc = torch.randn(nb, BS, HKV, D, dtype=DTYPE, device="cuda")
    vc = torch.randn(nb, BS, HKV, D, dtype=DTYPE, device="cuda")
    perm = torch.randperm(nb, device="cuda", dtype=torch.int32)
    prefix_table = perm[:pb].view(1, pb)
    own_tables = perm[pb:].view(b, ob)
    full = torch.cat([prefix_table.expand(b, -1), own_tables], dim=1).contiguous()
    q = torch.randn(b, HQ, D, dtype=DTYPE, device="cuda")
    total = prefix + own
    sl = torch.full((b,), total, dtype=torch.int32, device="cuda")
    own_sl = torch.full((b,), own, dtype=torch.int32, device="cuda")
    plain_out, casc_out = torch.empty_like(q), torch.empty_like(q)
    ps = decode_partition(b, total, sms)
    parts = math.ceil(total / ps) if ps else 1
    es = torch.empty(b, HQ, parts, device="cuda")
    ml, tmp = torch.empty_like(es), torch.empty(b, HQ, parts, D, device="cuda")
    args = (q, kc, vc, HKV, D**-0.5, full, sl, BS, total, None, "auto", 1.0, 1.0)

    def plain():
        if ps:
            ops.paged_attention_v2(plain_out, es, ml, tmp, *args, partition_size=ps)
        else:
            ops.paged_attention_v1(plain_out, *args)

    c = CascadeDecode(q, kc, vc, HKV)
    c.plan(prefix, [own] * b)

    def cascade():
        c.run(casc_out, q, kc, vc, D**-0.5, prefix_table, own_tables, own_sl, own)

    res = {"plain": time_graph([plain]), "cascade": time_graph([cascade])}
    plain()
    cascade()
    res["err"] = float((plain_out.float() - casc_out.float()).abs().max())
    res["plain_bytes"] = 2 * b * total * HKV * D * 2
    res["cascade_bytes"] = 2 * (prefix + b * own) * HKV * D * 2
    return res


def print_cascade(sms: int, bw: float) -> None:
    print(
        "\nCascade decode, sequences sharing a cached prefix (us; plain = the split-K decode over "
        "each whole context; TB/s = bytes each must read / time)"
    )
    print(
        f"{'B*(prefix+own)':>16} {'plain':>9} {'cascade':>9} {'speed-up':>8} {'plain TB/s':>10} "
        f"{'casc TB/s':>9} {'max err':>8}"
    )
    for b, prefix, own in CASCADE_SHAPES:
        r = bench_cascade(b, prefix, own, sms)
        print(
            f"{b:>4}*({prefix:>5}+{own:<4}) {fmt(r['plain'])} {fmt(r['cascade'])} "
            f"{ratio(r['plain'], r['cascade']):>8} {r['plain_bytes'] / r['plain'] / 1e12:10.2f} "
            f"{r['cascade_bytes'] / r['cascade'] / 1e12:9.2f} {r['err']:8.4f}"
        )
        torch.cuda.empty_cache()


def decode_kernel_name() -> str:
    """Which decode kernel the library runs on this benchmark's calls (NHD cache, bf16)."""
    q, cache = _probe(1)
    return {
        "hopper": "Hopper bulk-copy (decode_bulk)",
        "tensor_core": "tensor-core (decode_mma)",
        "cuda_core": "CUDA-core",
    }[ops.decode_kernel(q, cache, cache, HKV)]


def _prefill_inputs(b: int, length: int) -> dict:
    n = b * length
    return {
        "q": torch.randn(n, HQ, D, dtype=DTYPE, device="cuda"),
        "k": torch.randn(n, HKV, D, dtype=DTYPE, device="cuda"),
        "v": torch.randn(n, HKV, D, dtype=DTYPE, device="cuda"),
        "qsl": torch.arange(0, n + 1, length, dtype=torch.int32, device="cuda"),
        "sl": torch.full((b,), length, dtype=torch.int32, device="cuda"),
        # no cached prefix
        "kc": torch.empty(1, BS, HKV, D, dtype=DTYPE, device="cuda"),
        "bt": torch.zeros(b, 1, dtype=torch.int32, device="cuda"),
    }


def _prefill_calls(x: dict, length: int, kernel: str = "auto") -> list[Callable[[], None]]:
    out = torch.empty_like(x["q"])
    kw = _kernel_kw(kernel)
    return [
        lambda: ops.context_attention_fwd(
            x["q"],
            x["k"],
            x["v"],
            out,
            "auto",
            x["kc"],
            x["kc"],
            x["bt"],
            x["qsl"],
            x["sl"],
            None,
            length,
            **kw,
        )
    ] * 3


def _time_prefill_ours(x: dict, length: int) -> float:
    return time_graph(_prefill_calls(x, length))


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    """Sets an environment variable for the block (builds before kernels were chosen by argument
    read their knobs per call, so the setting holds for the calls captured inside)."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def _takes_kernel() -> bool:
    """Whether the installed pagedkv chooses kernels by argument (the A/B runs of
    gpu_kernels_run.sh time this script against builds from before that too)."""
    return "kernel" in inspect.signature(ops.context_attention_fwd).parameters


def _time_prefill_wgmma(x: dict, length: int) -> Optional[float]:
    """Our prefill on the Hopper wgmma kernel, named (a call it does not cover is an error,
    reported as n/a, instead of a silent fallback); None off compute capability 9.x."""
    if torch.cuda.get_device_capability()[0] != 9:
        return None
    if _takes_kernel():
        return try_time(lambda: _prefill_calls(x, length, "hopper"))
    with _env("PAGEDKV_PREFILL_WGMMA", "2"):  # the older builds' "required" switch
        return try_time(lambda: _prefill_calls(x, length))


def _default_prefill_kernel() -> str:
    """The prefill kernel the library picks for the benchmark's calls (docs/kernels.md)."""
    if torch.cuda.get_device_capability()[0] == 9:
        return "Hopper wgmma kernel"
    return "tensor-core mma.sync kernel"


def bench_prefill_ours(b: int, length: int) -> float:
    """Seconds per call of our prefill alone."""
    return _time_prefill_ours(_prefill_inputs(b, length), length)


def bench_prefill(b: int, length: int) -> dict:
    x = _prefill_inputs(b, length)
    q, k, v = x["q"], x["k"], x["v"]
    res = {"flops": 4 * b * HQ * D * length * (length + 1) / 2}
    res["ours"] = _time_prefill_ours(x, length)
    res["wgmma"] = _time_prefill_wgmma(x, length)
    qs = q.view(b, length, HQ, D).transpose(1, 2)
    ks = k.view(b, length, HKV, D).transpose(1, 2)
    vs = v.view(b, length, HKV, D).transpose(1, 2)

    def sdpa(backend):
        def make():
            def f():
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)

            return [f] * 3

        return make

    res["cudnn"] = try_time(sdpa(SDPBackend.CUDNN_ATTENTION))
    res["flash"] = try_time(sdpa(SDPBackend.FLASH_ATTENTION))
    return res


def bench_extend(b: int, prefix: int, new: int) -> dict:
    """Our prefill of `new` tokens per sequence over a paged cached prefix of `prefix` tokens
    (context_attention_fwd) against SDPA on the same data laid out contiguously with a lower-
    right causal mask (query i sees keys 0 .. prefix + i), query heads expanded for the peers."""
    kc, vc, bt = make_cache(b, prefix)
    n = b * new
    q = torch.randn(n, HQ, D, dtype=DTYPE, device="cuda")
    k = torch.randn(n, HKV, D, dtype=DTYPE, device="cuda")
    v = torch.randn(n, HKV, D, dtype=DTYPE, device="cuda")
    qsl = torch.arange(0, n + 1, new, dtype=torch.int32, device="cuda")
    sl = torch.full((b,), prefix + new, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)

    def ours() -> None:
        ops.context_attention_fwd(q, k, v, out, "auto", kc, vc, bt, qsl, sl, None, new)

    res = {
        "flops": 4 * b * HQ * D * (new * prefix + new * (new + 1) / 2),
        "ours": time_graph([ours] * 3),
    }
    kc8, vc8, bt8 = make_cache(b, prefix, "fp8")  # the same call over an fp8 (e4m3) prefix

    def ours_fp8() -> None:
        ops.context_attention_fwd(q, k, v, out, "fp8", kc8, vc8, bt8, qsl, sl, None, new)

    res["fp8"] = time_graph([ours_fp8] * 3)

    def contiguous(cache, fresh):  # [b, HQ, prefix + new, D]
        old = cache[bt.long()].reshape(b, -1, HKV, D)[:, :prefix]
        full = torch.cat([old, fresh.view(b, new, HKV, D)], 1).transpose(1, 2)
        return full.repeat_interleave(HQ // HKV, dim=1).contiguous()

    ks, vs = contiguous(kc, k), contiguous(vc, v)
    qs = q.view(b, new, HQ, D).transpose(1, 2)
    mask = causal_lower_right(new, prefix + new)

    def sdpa(backend):
        def make():
            def f():
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask)

            return [f] * 3

        return make

    res["cudnn"] = try_time(sdpa(SDPBackend.CUDNN_ATTENTION))
    res["flash"] = try_time(sdpa(SDPBackend.FLASH_ATTENTION))
    ours()
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        ref = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask)
    res["err"] = float((out.view(b, new, HQ, D).transpose(1, 2) - ref).abs().max())
    return res


def bench_cache_write(num_tokens: int) -> dict:
    nb = math.ceil(num_tokens / BS) * 2
    kc = torch.empty(nb, BS, HKV, D, dtype=DTYPE, device="cuda")
    vc = torch.empty_like(kc)
    sets = []
    per = 2 * 2 * num_tokens * HKV * D * 2  # read + write, keys and values
    for _ in range(max(1, min(8, ROTATE_BYTES // per))):
        key = torch.randn(num_tokens, HKV, D, dtype=DTYPE, device="cuda")
        val = torch.randn_like(key)
        slots = torch.randperm(nb * BS, device="cuda")[:num_tokens]
        sets.append((key, val, slots))
    t = time_graph(
        [
            (lambda a=a, b_=b_, s=s: ops.reshape_and_cache_flash(a, b_, kc, vc, s))
            for a, b_, s in sets
        ]
    )
    return {"ours": t, "bytes": per}


def fmt(x: Optional[float], unit: float = 1e6) -> str:
    return "n/a" if x is None else f"{x * unit:9.1f}"


def ratio(a: Optional[float], b: Optional[float]) -> str:
    return "n/a" if a is None or b is None else f"{a / b:5.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer shapes (smoke run)")
    ap.add_argument(
        "--decode-only",
        action="store_true",
        help="only the decode table (skip prefill and reshape_and_cache)",
    )
    ap.add_argument(
        "--skewed",
        action="store_true",
        help="add the skewed-batch decode table (balanced vs split-K vs FA2 varlen)",
    )
    ap.add_argument(
        "--cascade-only",
        action="store_true",
        help="only the cascade (shared-prefix) decode table",
    )
    ap.add_argument(
        "--skewed-only",
        action="store_true",
        help="only the skewed-batch decode table (balanced vs split-K vs FA2 varlen)",
    )
    ap.add_argument(
        "--prefill-only",
        action="store_true",
        help="only the prefill table (skip decode and reshape_and_cache)",
    )
    ap.add_argument(
        "--host-latency",
        action="store_true",
        help="time each replay from an idle GPU, including the host's graph "
        "submission (the harness of the tables before commit 1e250f7)",
    )
    args = ap.parse_args()
    if args.host_latency:
        global QUEUE_AHEAD_CYCLES
        QUEUE_AHEAD_CYCLES = 0
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    bw = copy_bandwidth()
    print(
        f"device: {props.name}, {sms} SMs; copy bandwidth (read+write) {bw / 1e12:.2f} TB/s; "
        f"decode kernel: {decode_kernel_name()}; replays "
        f"{'from an idle GPU' if args.host_latency else 'queued ahead'}"
    )
    if args.skewed_only:
        print_skewed(sms, bw, args.quick)
        return
    if args.cascade_only:
        print_cascade(sms, bw)
        return
    dec = [] if args.prefill_only else DECODE_SHAPES[:2] if args.quick else DECODE_SHAPES
    print("\nDecode (us; speed-up = other time / ours; BW = KV bytes read / time vs copy BW)")
    print(
        f"{'B*L':>9} {'split':>6} {'ours':>9} {'cuDNN':>9} {'FA2':>9} {'gather':>9} "
        f"{'vs cuDNN':>8} {'vs FA2':>7} {'vs gath':>7} {'TB/s':>6} {'of copy':>7} "
        f"{'fp8':>9} {'fp8 gain':>8}"
    )
    for b, length in dec:
        # fp8 right before bf16: the two kernels of the "fp8 gain" ratio run next to each other,
        # not with the peers' runs (gather + SDPA over GBs of copies) between them.
        r8 = bench_decode(b, length, sms, "fp8")
        r = bench_decode(b, length, sms)
        tbs = r["bytes"] / r["ours"]
        print(
            f"{b:>4}*{length:<5} {r['ps']:>6} {fmt(r['ours'])} {fmt(r['cudnn'])} "
            f"{fmt(r['flash'])} {fmt(r['gather'])} {ratio(r['cudnn'], r['ours']):>8} "
            f"{ratio(r['flash'], r['ours']):>7} {ratio(r['gather'], r['ours']):>7} "
            f"{tbs / 1e12:6.2f} {tbs / bw:7.2f} {fmt(r8['ours'])} "
            f"{ratio(r['ours'], r8['ours']):>8}"
        )
        torch.cuda.empty_cache()
    if args.skewed and not args.prefill_only:
        print_skewed(sms, bw, args.quick)
        print_cascade(sms, bw)
    if args.decode_only:
        return
    pre = PREFILL_SHAPES[:1] if args.quick else PREFILL_SHAPES
    print(
        f"\nPrefill, causal, no cached prefix (us; TFLOP/s of ours; ours = the library's "
        f"choice: {_default_prefill_kernel()})"
    )
    print(
        "  wgmma = ours on the Hopper wgmma kernel, named (n/a off sm_90; where it is the "
        "choice, a second sample of the same kernel)"
    )
    print(
        f"{'B*L':>9} {'ours':>9} {'cuDNN':>9} {'FA2':>9} {'vs cuDNN':>8} {'vs FA2':>7} "
        f"{'TFLOP/s':>8} {'wgmma':>9} {'wg/FA2':>7} {'TFLOP/s':>8}"
    )
    for b, length in pre:
        r = bench_prefill(b, length)
        wg_tf = "n/a" if r["wgmma"] is None else f"{r['flops'] / r['wgmma'] / 1e12:8.1f}"
        print(
            f"{b:>4}*{length:<5} {fmt(r['ours'])} {fmt(r['cudnn'])} {fmt(r['flash'])} "
            f"{ratio(r['cudnn'], r['ours']):>8} {ratio(r['flash'], r['ours']):>7} "
            f"{r['flops'] / r['ours'] / 1e12:8.1f} {fmt(r['wgmma'])} "
            f"{ratio(r['flash'], r['wgmma']):>7} {wg_tf:>8}"
        )
        torch.cuda.empty_cache()
    print(
        "\nExtend over a cached prefix in randomly permuted 16-token blocks (us; peers: SDPA "
        "on contiguous data, lower-right causal mask, query heads expanded; max |ours - FA2|)"
    )
    print("  fp8 = ours over an fp8 (e4m3) prefix, gain = ours / fp8")
    print(
        f"{'B*prefix+new':>15} {'ours':>9} {'cuDNN':>9} {'FA2':>9} {'vs cuDNN':>8} "
        f"{'vs FA2':>7} {'TFLOP/s':>8} {'max err':>8} {'fp8':>9} {'gain':>6}"
    )
    for b, prefix, new in EXTEND_SHAPES[:1] if args.quick else EXTEND_SHAPES:
        r = bench_extend(b, prefix, new)
        print(
            f"{b:>4}*{prefix:>5}+{new:<4} {fmt(r['ours'])} {fmt(r['cudnn'])} "
            f"{fmt(r['flash'])} {ratio(r['cudnn'], r['ours']):>8} "
            f"{ratio(r['flash'], r['ours']):>7} {r['flops'] / r['ours'] / 1e12:8.1f} "
            f"{r['err']:8.4f} {fmt(r['fp8'])} {ratio(r['ours'], r['fp8']):>6}"
        )
        torch.cuda.empty_cache()
    if args.prefill_only:
        return
    print("\nreshape_and_cache_flash (bytes read + written / time vs copy BW)")
    for n in (256, 16384, 65536):
        r = bench_cache_write(n)
        tbs = r["bytes"] / r["ours"]
        print(
            f"  tokens {n:>6}: {fmt(r['ours'])} us  {tbs / 1e12:5.2f} TB/s  {tbs / bw:5.2f} of copy"
        )


if __name__ == "__main__":
    main()
