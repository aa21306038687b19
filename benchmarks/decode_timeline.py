"""Per-CTA timeline of the Hopper decode on gpu_attention.py's data: when each CTA started, got
past the programmatic wait, received warp 0's first stage, finished warp 0's loop and ended
(the GPU's global timer), as percentiles over the CTAs of one eager call. It shows what a
kernel's duration is made of: the latency to the first data, the spread of the CTAs' ends in
a wave, the epilogue (benchmarks/RESULTS.md, "Where a decode call's time goes").

Needs a profiling build (the stamps compile to nothing otherwise):
    pip install --no-build-isolation . -Ccmake.define.PAGEDKV_DECODE_TIMELINE=ON
    python benchmarks/decode_timeline.py 16x4096 1x32768 64x2048:fp8 [--cupti]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections import defaultdict
from typing import Callable, Optional

import gpu_attention as ga
import numpy as np
import pagedkv
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

STAMPS = ["entry", "after wait", "first data", "loop done", "CTA done"]
WORDS = len(STAMPS) + 1  # the stamps, then the SM id


def _records(path: str) -> list[np.ndarray]:
    raw, recs, off = np.fromfile(path, dtype=np.uint64), [], 0
    while off < len(raw):
        n = int(raw[off])
        recs.append(raw[off + 1 : off + 1 + WORDS * n].reshape(n, WORDS).astype(np.int64))
        off += 1 + WORDS * n
    return recs


def _row(name: str, values: np.ndarray) -> str:
    cells = " ".join(f"{v / 1e3:8.2f}" for v in np.percentile(values, [0, 10, 50, 90, 100]))
    return f"  {name:<24}{cells}"


def _sm_means(r: np.ndarray, sms: int, col: np.ndarray) -> np.ndarray:
    """Mean of `col` over each SM's CTAs (NaN for SMs without one)."""
    n = np.bincount(r[:, 5], minlength=sms)
    with np.errstate(invalid="ignore"):
        return np.bincount(r[:, 5], weights=col, minlength=sms) / n


def by_sm(recs: list[np.ndarray], sms: int, groups: Optional[np.ndarray] = None) -> None:
    """Whether the slow CTAs are the SMs' doing: warp 0's streaming time by how many CTAs its SM
    ran, and how well the SMs' mean streaming times of one call predict the next call's (a
    correlation near 1: some SMs are slower every time; near 0: the tail is random). With
    `groups` (each SM's GPC or TPC, from sm_groups.cu), the SM means averaged per group."""
    r = recs[-1]
    r = r[r[:, 0] > 0]
    stream = (r[:, 3] - r[:, 2]) / 1e3
    count = np.bincount(r[:, 5], minlength=sms)[r[:, 5]]
    cells = ", ".join(
        f"{c} CTAs/SM: {stream[count == c].mean():.1f} us ({(count == c).sum()})"
        for c in np.unique(count)
    )
    print(f"  warp 0 streaming by the SM's CTA count: {cells}")
    means = []
    for c in recs[-3:]:
        c = c[c[:, 0] > 0]
        means.append(_sm_means(c, sms, (c[:, 3] - c[:, 2]) / 1e3))
    for a, b in zip(means, means[1:]):
        ok = ~(np.isnan(a) | np.isnan(b))
        corr = np.corrcoef(a[ok], b[ok])[0, 1]
        print(
            f"  SM mean streaming, call to call: correlation {corr:.2f}"
            f", spread of SM means p10/p90 {np.percentile(b[ok], 10):.1f}/"
            f"{np.percentile(b[ok], 90):.1f} us"
        )
    if groups is not None:
        last = means[-1]
        cells = []
        for g in np.unique(groups):
            m = last[(groups == g) & ~np.isnan(last)]
            cells.append(f"{(groups == g).sum()} SMs {m.mean():.1f}" if len(m) else "-")
        print(f"  SM mean streaming per group (us): {'; '.join(cells)}")


def kernel_durations(x: dict, b: int, length: int, kv: str, ours: Callable[[], None]) -> None:
    """Each kernel's own duration (CUPTI, through torch.profiler; eager calls, medians of 5),
    ours and, for a bf16 cache, cuDNN's on the same data laid out contiguously: what the
    graph-replay harness measures minus its per-replay overhead."""
    qs = x["q"].view(b, ga.HQ, 1, ga.D)
    calls = [ours]
    if kv == "auto":
        k, v = ga.contiguous_kv(*x["caches"][0], b, length)

        def cudnn() -> None:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(qs, k, v, enable_gqa=True)

        calls.append(cudnn)
    for c in calls:
        c()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            for c in calls:
                c()
                torch.cuda.synchronize()
    times = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times[e.name[:70]].append(e.device_time)
    for name, ts in times.items():
        print(f"  kernel {sorted(ts)[len(ts) // 2]:8.1f} us  {name}")


def report(
    b: int, length: int, kv: str, calls: int, cupti: bool, groups: Optional[np.ndarray] = None
) -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x = ga._decode_inputs(b, length, sms, kv)
    graph_us = ga._time_ours(x, length, kv) * 1e6
    ours = ga.decode_calls(x, length, kv)[0]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "timeline.bin")
        try:
            pagedkv._C.ops_set_decode_timeline_file(path)
        except ValueError as e:  # not a profiling build
            raise SystemExit(f"{e}: build with -Ccmake.define.PAGEDKV_DECODE_TIMELINE=ON") from e
        try:
            for _ in range(calls):
                ours()
        finally:
            pagedkv._C.ops_set_decode_timeline_file("")
        if not os.path.exists(path):
            raise SystemExit(
                "no timeline written: build with "
                "-Ccmake.define.PAGEDKV_DECODE_TIMELINE=ON (Hopper decode only)"
            )
        recs = _records(path)
    r = recs[-1]
    r = r[r[:, 0] > 0]  # CTAs that returned early (partitions past the end) left zeros
    t0 = r[:, 0].min()
    spans = ", ".join(f"{(c[:, 4].max() - c[c[:, 0] > 0, 0].min()) / 1e3:.1f}" for c in recs)
    print(
        f"\n{b}*{length} {kv}: split {x['ps']}, {len(r)} CTAs; span of each call {spans} us; "
        f"graph-replay harness {graph_us:.1f} us"
    )
    print(f"  {'(us)':<24}{'min':>8} {'p10':>8} {'p50':>8} {'p90':>8} {'max':>8}")
    print(_row("start", r[:, 0] - t0))
    print(_row("programmatic wait", r[:, 1] - r[:, 0]))
    print(_row("first data", r[:, 2] - r[:, 1]))
    print(_row("warp 0 streaming", r[:, 3] - r[:, 2]))
    print(_row("warp 0 loop done", r[:, 3] - t0))
    print(_row("epilogue + other warps", r[:, 4] - r[:, 3]))
    print(_row("CTA done", r[:, 4] - t0))
    per_sm = np.bincount(r[:, 5], minlength=sms)
    print(f"  CTAs per SM over the call: {per_sm.min()}..{per_sm.max()}")
    by_sm(recs, sms, groups)
    if cupti:
        kernel_durations(x, b, length, kv, ours)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "shapes",
        nargs="*",
        default=["16x4096", "1x4096", "64x2048:fp8"],
        help="BxL[:fp8] decode shapes (batch x context), bf16 cache unless :fp8",
    )
    ap.add_argument(
        "--calls",
        type=int,
        default=3,
        help="eager calls per shape (the last one is summarised; all give spans)",
    )
    ap.add_argument(
        "--cupti",
        action="store_true",
        help="also each kernel's own duration (torch.profiler), ours and cuDNN's",
    )
    ap.add_argument(
        "--sm-groups",
        metavar="FILE",
        help="'sm group' lines (sm_groups.cu's output): SM means per group too",
    )
    args = ap.parse_args()
    groups = None
    if args.sm_groups:
        pairs = np.loadtxt(args.sm_groups, dtype=np.int64, ndmin=2)
        groups = pairs[np.argsort(pairs[:, 0]), 1]
    t = torch.zeros(1, device="cuda")
    tiny = ga.time_graph([lambda: t.add_(1)]) * 1e6
    print(f"graph-replay harness, one tiny kernel: {tiny:.1f} us (its per-replay overhead)")
    for shape in args.shapes:
        dims, _, kv = shape.partition(":")
        b, length = (int(v) for v in dims.split("x"))
        report(b, length, kv or "auto", args.calls, args.cupti, groups)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
