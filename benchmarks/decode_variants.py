"""Decode kernels side by side on benchmarks/gpu_attention.py's shapes (bf16, Hq=32, Hkv=8,
D=128, block 16): the tensor-core kernel (decode_mma) and the Hopper bulk-copy kernel
(decode_bulk) with its own occupancy choice and fixed at 2, 3 and 4 CTAs per SM, bf16 and fp8
caches, each against cuDNN SDPA on the same data measured in the same run. Each variant uses
the split-K partition the library would pick for its kernel.

    python benchmarks/decode_variants.py [--quick]
"""

from __future__ import annotations

import argparse
import os

import gpu_attention as ga
import torch

# (name, environment): PAGEDKV_DECODE_BULK / PAGEDKV_DECODE_MMA pick the kernel (Hopper bulk-copy,
# tensor-core, CUDA-core), PAGEDKV_DECODE_CTAS_PER_SM / PAGEDKV_DECODE_SMEM_KB their occupancy.
VARIANTS = [("mma-auto", {"PAGEDKV_DECODE_BULK": "0", "PAGEDKV_DECODE_MMA": "1"}),
            ("bulk-auto", {"PAGEDKV_DECODE_BULK": "1"}),
            ("bulk-2/SM", {"PAGEDKV_DECODE_BULK": "1", "PAGEDKV_DECODE_CTAS_PER_SM": "2"}),
            ("bulk-3/SM", {"PAGEDKV_DECODE_BULK": "1", "PAGEDKV_DECODE_CTAS_PER_SM": "3"}),
            ("bulk-4/SM", {"PAGEDKV_DECODE_BULK": "1", "PAGEDKV_DECODE_CTAS_PER_SM": "4"})]
KNOBS = ("PAGEDKV_DECODE_BULK", "PAGEDKV_DECODE_MMA", "PAGEDKV_DECODE_SMEM_KB",
         "PAGEDKV_DECODE_CTAS_PER_SM")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="first two shapes only")
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = ga.copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, {sms} SMs, copy BW {bw / 1e12:.2f} TB/s")
    print("per variant: bf16 us, x = cuDNN time / ours, KV bytes read / time / copy BW; fp8 us")
    head = " ".join(f"{n + ' bf16':>19} {'fp8':>7}" for n, _ in VARIANTS)
    print(f"{'B*L':>10} {'cuDNN':>8} {head}")
    shapes = ga.DECODE_SHAPES[:2] if args.quick else ga.DECODE_SHAPES
    for b, length in shapes:
        for k in KNOBS:
            os.environ.pop(k, None)
        ref = ga.bench_decode(b, length, sms)
        cells = []
        for _, env in VARIANTS:
            for k in KNOBS:
                os.environ.pop(k, None)
            os.environ.update(env)
            t16 = ga.bench_decode_ours(b, length, sms, "auto")
            t8 = ga.bench_decode_ours(b, length, sms, "fp8")
            x = "n/a" if ref["cudnn"] is None else f"{ref['cudnn'] / t16:.2f}x"
            cells.append(f"{t16 * 1e6:7.1f} {x:>6} {ref['bytes'] / t16 / bw:4.2f} "
                         f"{t8 * 1e6:7.1f}")
        print(f"{b:>4}*{length:<5} {ga.fmt(ref['cudnn'])[-8:]} " + " ".join(cells), flush=True)
        torch.cuda.empty_cache()
    for k in KNOBS:
        os.environ.pop(k, None)


if __name__ == "__main__":
    main()
