"""Decode kernels side by side on benchmarks/gpu_attention.py's shapes (bf16, Hq=32, Hkv=8, D=128,
block 16), bf16 and fp8 caches, each against cuDNN SDPA on the same data measured in the same run:
the Hopper bulk-copy kernel (decode_bulk), the tensor-core kernel (decode_mma) and the CUDA-core
kernel, each named through the ops' `kernel` argument and with the split-K partition the library
picks for it. --layouts: the default kernel with blocks in random and in sequential order;
--partitions: the default kernel at fixed split-K partition sizes. (The occupancy, copy-form,
L2-policy, grid-order and launch variants measured here before are in RESULTS.md's "tried and not
kept" list.)

    python benchmarks/decode_variants.py [--quick] [--variants a,b] [--layouts |
                                         --partitions [--every-shape] [--sizes 0,672,...]
                                         [--shapes 1x32768,...]]
"""

from __future__ import annotations

import argparse

import gpu_attention as ga
import torch

# (name, the ops' kernel argument).
KERNELS = [("hopper", "hopper"), ("tensor_core", "tensor_core"), ("cuda_core", "cuda_core")]


_make_cache = ga.make_cache  # the benchmark's own cache (NHD, randomly permuted blocks)


def cache_sequential(num_seqs: int, seq_len: int, kv_dtype: str = "auto"):
    """gpu_attention's NHD cache, but each sequence's blocks in order (identity block table)."""
    kc, vc, tables = _make_cache(num_seqs, seq_len, kv_dtype)
    return kc, vc, torch.arange(tables.numel(), device="cuda", dtype=torch.int32).view_as(tables)


# (name, cache maker) for --layouts: the library's default kernel on differently stored caches.
LAYOUTS = [("nhd-permuted", _make_cache), ("nhd-in-order", cache_sequential)]


def partitions(
    every_shape: bool = False,
    sizes: list[int] | None = None,
    shapes: list[tuple[int, int]] | None = None,
) -> None:
    """The default kernel at fixed split-K partition sizes (0 = single pass) on the small-batch
    shapes (every shape with `every_shape`, or `shapes`), bf16 and fp8, next to the size the
    library picks: data for decode_partition_size."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sizes = sizes or [0, 128, 256, 512, 1024, 2048, 4096]
    print(f"{torch.cuda.get_device_name()}: us per call; * = the library's choice")
    print(f"{'B*L':>10} {'kv':>5} " + " ".join(f"{p:>8}" for p in sizes))
    choose = ga.decode_partition
    if shapes is None:
        shapes = [s for s in ga.DECODE_SHAPES if every_shape or s[0] <= 16]
    for b, length in shapes:
        for kv in ("auto", "fp8"):
            picked = choose(b, length, sms, kv)
            cells = []
            for ps in sizes:
                if ps >= length:
                    cells.append(f"{'-':>8}")
                    continue
                ga.decode_partition = lambda *_, ps=ps: ps
                t = ga.bench_decode_ours(b, length, sms, kv)
                cells.append(f"{t * 1e6:7.1f}{'*' if ps == picked else ' '}")
            ga.decode_partition = choose
            print(f"{b:>4}*{length:<5} {kv:>5} " + " ".join(cells), flush=True)
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="first two shapes only")
    ap.add_argument(
        "--layouts",
        action="store_true",
        help="compare cache storage orders (default kernel) instead of kernels",
    )
    ap.add_argument(
        "--partitions",
        action="store_true",
        help="time the default kernel at fixed split-K partition sizes instead",
    )
    ap.add_argument(
        "--every-shape",
        action="store_true",
        help="with --partitions: every shape, not only batches up to 16",
    )
    ap.add_argument(
        "--sizes",
        default="",
        help="with --partitions: comma-separated partition sizes in keys (default: "
        "0,128,256,512,1024,2048,4096; 0 = single pass)",
    )
    ap.add_argument(
        "--shapes",
        default="",
        help="with --partitions: comma-separated BxL shapes (default: the benchmark's)",
    )
    ap.add_argument(
        "--variants",
        default="",
        help="comma-separated kernel variants to run (default: all of "
        + ", ".join(n for n, _ in KERNELS)
        + ")",
    )
    args = ap.parse_args()
    if args.partitions:
        sizes = [int(v) for v in args.sizes.split(",") if v]
        pairs = [v.split("x") for v in args.shapes.split(",") if v]
        shapes = [(int(b), int(length)) for b, length in pairs]
        partitions(args.every_shape, sizes or None, shapes or None)
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = ga.copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, {sms} SMs, copy BW {bw / 1e12:.2f} TB/s")
    print("per variant: bf16 us, x = cuDNN time / ours, KV bytes read / time / copy BW; fp8 us")
    wanted = [v for v in args.variants.split(",") if v]
    unknown = set(wanted) - {n for n, _ in KERNELS}
    if unknown:
        ap.error(f"--variants: unknown {sorted(unknown)}")
    variants = (
        [(n, "auto", maker) for n, maker in LAYOUTS]
        if args.layouts
        else [(n, k, _make_cache) for n, k in KERNELS if not wanted or n in wanted]
    )
    head = " ".join(f"{n + ' bf16':>22} {'fp8':>7}" for n, _, _ in variants)
    print(f"{'B*L':>10} {'cuDNN':>8} {head}")
    shapes = ga.DECODE_SHAPES[:2] if args.quick else ga.DECODE_SHAPES
    for b, length in shapes:
        ref = ga.bench_decode(b, length, sms)
        # A throwaway sample: the first of our kernel after the reference (which copies GBs for
        # the contiguous and gathered peers) ran ~15 % slow at 32*8192 in five of seven runs on
        # the H100, whichever variant came first; the table's columns should not depend on order.
        ga.bench_decode_ours(b, length, sms, "auto")
        cells = []
        for _, kernel, maker in variants:
            ga.make_cache = maker
            t16 = ga.bench_decode_ours(b, length, sms, "auto", kernel)
            t8 = ga.bench_decode_ours(b, length, sms, "fp8", kernel)
            ga.make_cache = _make_cache
            x = "n/a" if ref["cudnn"] is None else f"{ref['cudnn'] / t16:.2f}x"
            cells.append(f"{t16 * 1e6:10.1f} {x:>6} {ref['bytes'] / t16 / bw:4.2f} {t8 * 1e6:7.1f}")
        print(f"{b:>4}*{length:<5} {ga.fmt(ref['cudnn'])[-8:]} " + " ".join(cells), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
