"""The multi-LoRA ops on the CPU against float64 references: shapes off the tile sizes, tokens
without an adapter, several slices whose column ranges cross the kernel's chunks, a strided x,
and argument errors that name the argument."""

from __future__ import annotations

import numpy as np
import pytest
from support.deps import need
from support.lora_reference import TOL, expand_ref, random_indices, shrink_ref

torch = need("torch")

from pagedkv import ops  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [  # tokens, num_loras, K, rank, slice sizes
    (0, 2, 16, 4, [8]),
    (1, 1, 7, 1, [3]),
    (13, 3, 64, 8, [64, 16, 16]),
    (33, 4, 300, 16, [200, 300]),
    (5, 2, 48, 3, [1, 2, 3, 4, 5, 6, 7, 8]),
]


def _tol(dtype: torch.dtype) -> float:
    return TOL[str(dtype).rsplit(".", 1)[-1]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_shrink_then_expand(dtype: torch.dtype, shape: tuple) -> None:
    t, loras, k, r, sizes = shape
    g = torch.Generator().manual_seed(t * 31 + k)
    n, s = sum(sizes), len(sizes)
    x = torch.randn(t, k, generator=g).to(dtype)
    a = (torch.randn(loras, s * r, k, generator=g) / k**0.5).to(dtype)
    b = torch.randn(loras, n, r, generator=g).to(dtype)
    idx = random_indices(torch, t, loras, g)
    buf = ops.lora_shrink(x, a, idx)
    assert buf.dtype == torch.float32 and tuple(buf.shape) == (t, s * r)
    want = shrink_ref(x.double().numpy(), a.double().numpy(), idx.numpy())
    tol = _tol(dtype)
    np.testing.assert_allclose(buf.double().numpy(), want, rtol=tol, atol=tol)
    y = torch.randn(t, n, generator=g).to(dtype)
    y0 = y.clone()
    assert ops.lora_expand(y, buf, b, idx, sizes) is y
    want_y = expand_ref(
        y0.double().numpy(), buf.double().numpy(), b.double().numpy(), idx.numpy(), sizes
    )
    np.testing.assert_allclose(y.double().numpy(), want_y, rtol=tol, atol=tol * (r**0.5))
    no_adapter = idx.numpy() < 0
    assert torch.equal(y[no_adapter], y0[no_adapter])


def test_strided_rows() -> None:
    """x and out may be row slices of wider arrays (a fused qkv output, say)."""
    g = torch.Generator().manual_seed(0)
    wide = torch.randn(6, 40, generator=g)
    x = wide[:, 8:24]
    a = torch.randn(2, 4, 16, generator=g)
    idx = torch.tensor([0, 1, -1, 1, 0, 0], dtype=torch.int32)
    buf = ops.lora_shrink(x, a, idx)
    np.testing.assert_allclose(
        buf.numpy(),
        shrink_ref(x.double().numpy(), a.double().numpy(), idx.numpy()),
        rtol=1e-5,
        atol=1e-5,
    )
    out_wide = torch.randn(6, 50, generator=g)
    out = out_wide[:, 10:30]
    before = out_wide.clone()
    b = torch.randn(2, 20, 4, generator=g)
    ops.lora_expand(out, buf, b, idx)
    want = expand_ref(
        before[:, 10:30].double().numpy(),
        buf.double().numpy(),
        b.double().numpy(),
        idx.numpy(),
        [20],
    )
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(out_wide[:, :10], before[:, :10])
    assert torch.equal(out_wide[:, 30:], before[:, 30:])


def test_errors_name_the_argument() -> None:
    x = torch.randn(3, 8)
    a = torch.randn(2, 4, 8)
    idx = torch.tensor([0, 1, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="token_lora_indices\\[2\\] = 2"):
        ops.lora_shrink(x, a, idx)
    with pytest.raises(TypeError, match="token_lora_indices"):
        ops.lora_shrink(x, a, idx.long())
    with pytest.raises((TypeError, ValueError), match="a"):
        ops.lora_shrink(x, a.half(), torch.zeros(3, dtype=torch.int32))
    buf = torch.zeros(3, 8)
    out = torch.zeros(3, 10)
    b = torch.randn(2, 10, 4)
    ok = torch.zeros(3, dtype=torch.int32)
    with pytest.raises(ValueError, match="slice_sizes sum to 9"):
        ops.lora_expand(out, buf, b, ok, [5, 4])
    with pytest.raises(ValueError, match="buf"):
        ops.lora_expand(out, buf, b, ok, [10])  # one slice of rank 4 needs buf [3, 4]
