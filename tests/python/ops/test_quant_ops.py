"""pagedkv.ops.int4_gemm on the CPU against a float64 dequantise-then-multiply reference over
random shapes, group sizes and dtypes, and its argument errors."""

from __future__ import annotations

import pytest
from support.deps import need
from support.int4_reference import TOL, random_int4

torch = need("torch")

from pagedkv import ops  # noqa: E402

SHAPES = [(0, 8, 16, 16), (1, 40, 64, 32), (5, 1, 64, 64), (33, 130, 96, 16), (70, 64, 256, 128)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m, n, k, group", SHAPES)
def test_int4_gemm_matches_float64(m: int, n: int, k: int, group: int,
                                   dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(m * 1000 + n)
    q = random_int4(n, k, group, dtype, g)
    x = torch.randn(m, k + 3, generator=g).to(dtype)[:, :k]  # strided rows
    out = ops.int4_gemm(x, q["qweight"], q["scales"], q["zeros"], group)
    want = x.double() @ q["w"].T
    assert out.shape == (m, n) and out.dtype == dtype
    if m:
        scale = max(1.0, float(want.abs().max()))
        assert float((out.double() - want).abs().max()) <= TOL[dtype] * scale


def test_errors_name_the_argument() -> None:
    g = torch.Generator().manual_seed(0)
    q = random_int4(8, 32, 16, torch.float32, g)
    x = torch.randn(2, 32)
    with pytest.raises(ValueError, match="group_size = 12"):
        ops.int4_gemm(x, q["qweight"], q["scales"], q["zeros"], 12)
    with pytest.raises(TypeError, match="scales"):
        ops.int4_gemm(x, q["qweight"], q["scales"].half(), q["zeros"], 16)
    with pytest.raises(ValueError, match="qweight"):
        ops.int4_gemm(torch.randn(2, 64), q["qweight"], q["scales"], q["zeros"], 16)
    with pytest.raises(TypeError, match="zeros"):
        ops.int4_gemm(x, q["qweight"], q["scales"], q["zeros"].int(), 16)
    with pytest.raises(ValueError, match="out"):
        ops.int4_gemm(x, q["qweight"], q["scales"], q["zeros"], 16, out=torch.empty(2, 7))
