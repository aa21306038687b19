"""Extend (new tokens over a cached paged prefix) with a bf16 prefix and with an fp8 (e4m3)
prefix, per prefill kernel and head size: how much of the 16-bit speed an fp8 cache keeps.

    python benchmarks/prefill_fp8_prefix.py [--head-sizes 64,96,128,256] [--kernels default]
                                            [--quick]

bf16 queries, Hq=32, Hkv=8, block 16, NHD cache in randomly permuted blocks, the shapes of
gpu_attention.py's extend table. Kernels: "default" (the library's choice: the Hopper wgmma
kernel for head sizes 64 and 128 on sm_90, else the mma.sync kernel) and "mma.sync"
(PAGEDKV_PREFILL_WGMMA=0). fp8 columns: "staged" (the default: the mma.sync kernel copies the
prefix's bytes with cp.async and widens them in shared memory) and "regs"
(PAGEDKV_PREFILL_MMA_FP8_STAGED=0: loaded into registers and converted when issued); the wgmma
kernel has its own fp8 path, so its two fp8 columns are two samples of it.
"""

from __future__ import annotations

import argparse
import contextlib
import math

import gpu_attention as ga
import torch

HQ, HKV, BS = 32, 8, 16
KERNELS = [("default", {}), ("mma.sync", {"PAGEDKV_PREFILL_WGMMA": "0"})]


def make_cache(b: int, prefix: int, d: int, kv_dtype: str):
    nb = b * math.ceil(prefix / BS)
    if kv_dtype == "auto":
        kc, vc = (torch.randn(nb, BS, HKV, d, dtype=torch.bfloat16, device="cuda")
                  for _ in range(2))
    else:
        kc, vc = (torch.randn(nb, BS, HKV, d, device="cuda").to(torch.float8_e4m3fn)
                  .view(torch.uint8) for _ in range(2))
    return kc, vc, torch.randperm(nb, device="cuda", dtype=torch.int32).view(b, -1)


def bench(b: int, prefix: int, new: int, d: int, env: dict) -> dict:
    """Seconds per call over a bf16 prefix and over an fp8 one (staged and through registers)."""
    n = b * new
    q = torch.randn(n, HQ, d, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(n, HKV, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    qsl = torch.arange(0, n + 1, new, dtype=torch.int32, device="cuda")
    sl = torch.full((b,), prefix + new, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    res = {}
    for name, kv_dtype, staged in [("bf16", "auto", "1"), ("staged", "fp8", "1"),
                                   ("regs", "fp8", "0")]:
        kc, vc, bt = make_cache(b, prefix, d, kv_dtype)

        def call(kc=kc, vc=vc, bt=bt, kv_dtype=kv_dtype) -> None:
            ga.ops.context_attention_fwd(q, k, v, out, kv_dtype, kc, vc, bt, qsl, sl, None, new)

        with contextlib.ExitStack() as stack:
            for key, value in {**env, "PAGEDKV_PREFILL_MMA_FP8_STAGED": staged}.items():
                stack.enter_context(ga._env(key, value))
            res[name] = ga.time_graph([call] * 3)
        del kc, vc
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head-sizes", default="64,96,128,256",
                    help="comma-separated head sizes (default: 64,96,128,256)")
    ap.add_argument("--kernels", default="default,mma.sync",
                    help="comma-separated kernels to run: default, mma.sync (default: both)")
    ap.add_argument("--quick", action="store_true", help="the first extend shape only")
    args = ap.parse_args()
    sizes = [int(x) for x in args.head_sizes.split(",")]
    shapes = ga.EXTEND_SHAPES[:1] if args.quick else ga.EXTEND_SHAPES
    print(f"device: {torch.cuda.get_device_name()}; us per call; a vs b = b's time / a's time")
    print(f"{'kernel':>9} {'D':>4} {'B*prefix+new':>15} {'bf16':>9} {'staged':>9} {'regs':>9} "
          f"{'staged vs bf16':>14} {'regs vs bf16':>12} {'staged vs regs':>14}")
    for kname, env in [k for k in KERNELS if k[0] in args.kernels.split(",")]:
        for d in sizes:
            for b, prefix, new in shapes:
                r = bench(b, prefix, new, d, env)
                print(f"{kname:>9} {d:>4} {b:>4}*{prefix:>5}+{new:<4} {ga.fmt(r['bf16'])} "
                      f"{ga.fmt(r['staged'])} {ga.fmt(r['regs'])} "
                      f"{ga.ratio(r['bf16'], r['staged']):>14} "
                      f"{ga.ratio(r['bf16'], r['regs']):>12} "
                      f"{ga.ratio(r['regs'], r['staged']):>14}")
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
