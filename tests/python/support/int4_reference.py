"""Random int4 weights in the layout of pagedkv.ops.int4_gemm and their float64 dequantisation,
shared by the CPU (tests/python/ops) and CUDA (tests/python/kernels) tests of the op."""

from __future__ import annotations

from typing import Any

import torch

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def random_int4(n: int, k: int, group: int, dtype: Any, g: torch.Generator) -> dict[str, Any]:
    """qweight [N, K/2] uint8, scales [N, K/G] dtype, zeros [N, K/G] uint8 and W [N, K] (f64)."""
    codes = torch.randint(0, 16, (n, k), generator=g)
    zeros = torch.randint(0, 16, (n, k // group), generator=g)
    scales = (torch.rand(n, k // group, generator=g) * 0.2 / k ** 0.5).to(dtype)
    w = (codes - zeros.repeat_interleave(group, 1)).double() * \
        scales.double().repeat_interleave(group, 1)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return dict(qweight=packed, scales=scales, zeros=zeros.to(torch.uint8), w=w)
