"""Extend (new tokens over a cached paged prefix) with a bf16 prefix and with an fp8 (e4m3)
prefix, per prefill kernel and head size: how much of the 16-bit speed an fp8 cache keeps.

    python benchmarks/prefill_fp8_prefix.py [--head-sizes 64,96,128,256] [--kernels auto]
                                            [--quick]

bf16 queries, Hq=32, Hkv=8, block 16, NHD cache in randomly permuted blocks, the shapes of
gpu_attention.py's extend table. Kernels (the ops' `kernel` argument): "auto" (the library's
choice: the Hopper wgmma kernel for head sizes 64 and 128 on sm_90, else the mma.sync kernel)
and "tensor_core" (the mma.sync kernel, which copies an fp8 prefix's bytes with cp.async and
widens them in shared memory).
"""

from __future__ import annotations

import argparse
import math

import gpu_attention as ga
import torch

HQ, HKV, BS = 32, 8, 16
KERNELS = ("auto", "tensor_core")


def make_cache(b: int, prefix: int, d: int, kv_dtype: str):
    nb = b * math.ceil(prefix / BS)
    if kv_dtype == "auto":
        kc, vc = (
            torch.randn(nb, BS, HKV, d, dtype=torch.bfloat16, device="cuda") for _ in range(2)
        )
    else:
        kc, vc = (
            torch.randn(nb, BS, HKV, d, device="cuda").to(torch.float8_e4m3fn).view(torch.uint8)
            for _ in range(2)
        )
    return kc, vc, torch.randperm(nb, device="cuda", dtype=torch.int32).view(b, -1)


def bench(b: int, prefix: int, new: int, d: int, kernel: str) -> dict:
    """Seconds per call over a bf16 prefix and over an fp8 one."""
    n = b * new
    q = torch.randn(n, HQ, d, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(n, HKV, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    qsl = torch.arange(0, n + 1, new, dtype=torch.int32, device="cuda")
    sl = torch.full((b,), prefix + new, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    res = {}
    for name, kv_dtype in [("bf16", "auto"), ("fp8", "fp8")]:
        kc, vc, bt = make_cache(b, prefix, d, kv_dtype)

        def call(kc=kc, vc=vc, bt=bt, kv_dtype=kv_dtype) -> None:
            ga.ops.context_attention_fwd(
                q, k, v, out, kv_dtype, kc, vc, bt, qsl, sl, None, new, kernel=kernel
            )

        res[name] = ga.time_graph([call] * 3)
        del kc, vc
    return res


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--head-sizes",
        default="64,96,128,256",
        help="comma-separated head sizes (default: 64,96,128,256)",
    )
    ap.add_argument(
        "--kernels",
        default=",".join(KERNELS),
        help="comma-separated kernels to run (default: auto,tensor_core)",
    )
    ap.add_argument("--quick", action="store_true", help="the first extend shape only")
    args = ap.parse_args()
    sizes = [int(x) for x in args.head_sizes.split(",")]
    shapes = ga.EXTEND_SHAPES[:1] if args.quick else ga.EXTEND_SHAPES
    print(f"device: {torch.cuda.get_device_name()}; us per call; fp8 vs bf16 = bf16's time / fp8's")
    print(
        f"{'kernel':>11} {'D':>4} {'B*prefix+new':>15} {'bf16':>9} {'fp8':>9} {'fp8 vs bf16':>11}"
    )
    for kernel in args.kernels.split(","):
        for d in sizes:
            for b, prefix, new in shapes:
                r = bench(b, prefix, new, d, kernel)
                print(
                    f"{kernel:>11} {d:>4} {b:>4}*{prefix:>5}+{new:<4} {ga.fmt(r['bf16'])} "
                    f"{ga.fmt(r['fp8'])} {ga.ratio(r['bf16'], r['fp8']):>11}"
                )
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
