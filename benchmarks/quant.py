"""Quantized linear layers on the GPU against bf16 (cuBLAS): pagedkv.ops.int4_gemm (AWQ/GPTQ
weights, group 128) and the fp8 path (torch._scaled_mm with per-token activation scales, the
activation quantisation included), decode to prefill batch sizes, Llama-8B-like shapes.

  python benchmarks/quant.py --json quant.json
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F
from pagedkv import ops
from pagedkv.models.quantization.fp8 import FP8_MAX, quantize_per_channel

SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336)]  # (N out, K in)


def timed(fn: Callable[[], Any], iters: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def bench_shape(n: int, k: int, group: int, iters: int) -> list[dict[str, Any]]:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    qweight = torch.randint(0, 256, (n, k // 2), device="cuda", dtype=torch.uint8)
    scales = torch.rand(n, k // group, device="cuda", dtype=torch.bfloat16) * 0.01
    zeros = torch.randint(0, 16, (n, k // group), device="cuda", dtype=torch.uint8)
    w8, s8 = quantize_per_channel(w)
    s8 = s8.reshape(1, -1).contiguous()

    def fp8(x: torch.Tensor) -> torch.Tensor:  # the activation quantisation included
        xf = x.float()
        xs = xf.abs().amax(1, keepdim=True).clamp(min=1e-12) / FP8_MAX
        xq = (xf / xs).to(torch.float8_e4m3fn)
        return torch._scaled_mm(xq, w8.t(), scale_a=xs, scale_b=s8, out_dtype=torch.bfloat16)

    kernels: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "bf16": lambda x: F.linear(x, w),
        "int4": lambda x: ops.int4_gemm(x, qweight, scales, zeros, group),
        "fp8": fp8,
    }
    rows = []
    for m in (1, 16, 64, 256, 1024, 4096):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        row: dict[str, Any] = {"n": n, "k": k, "m": m}
        for name, fn in kernels.items():
            s = timed(lambda fn=fn, x=x: fn(x), iters)
            row[f"{name}_us"] = round(s * 1e6, 1)
            row[f"{name}_tflops"] = round(2 * m * n * k / s / 1e12, 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for n, k in SHAPES:
        rows += bench_shape(n, k, 128, args.iters)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
