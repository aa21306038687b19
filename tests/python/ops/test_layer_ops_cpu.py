"""The fused layer ops on the CPU against float64 references (fresh random shapes, strided views,
every dtype), against the eager torch formulas the models used before, and their argument
errors."""

from __future__ import annotations

import numpy as np
import pytest
from support.deps import need

torch = need("torch")

from pagedkv import ops  # noqa: E402
from support.layer_reference import (  # noqa: E402
    DTYPES,
    check_act_and_mul,
    check_rms_norm,
    check_rotary,
    cos_sin_cache,
)

TRIALS = range(6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("trial", TRIALS)
def test_rms_norm_matches_float64(dtype, fused, trial):
    check_rms_norm("cpu", dtype, fused)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("trial", TRIALS)
def test_rotary_matches_float64(dtype, trial):
    check_rotary("cpu", dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("trial", range(3))
def test_act_and_mul_matches_float64(dtype, name, trial):
    check_act_and_mul("cpu", dtype, name)


def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in units in the last place between two fp16 / bf16 arrays."""
    ia, ib = a.view(torch.int16).int(), b.view(torch.int16).int()
    # Map sign-magnitude bit patterns to a monotonic integer line.
    ia = torch.where(ia < 0, -32768 - ia, ia)
    ib = torch.where(ib < 0, -32768 - ib, ib)
    return int((ia - ib).abs().max())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_ops_round_like_the_eager_formulas(dtype):
    """The models' eager math (HF's) rounds each step to the dtype; the ops do the same, so
    replacing one by the other leaves greedy decodes where they were. Rotary is elementwise
    products and sums: bit for bit. The norm's reduction order and silu's exp may differ in
    fp32's last bit: at most 1 ulp of the dtype apart, and almost always equal."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, 128, generator=g).to(dtype)
    cache = cos_sin_cache(256, 128, 10000.0, torch.float32, "cpu")
    pos = torch.randint(0, 256, (64,), generator=g)
    cos, sin = cache[pos, :64].to(dtype)[:, None], cache[pos, 64:].to(dtype)[:, None]
    x1, x2 = x[..., :64], x[..., 64:]
    eager = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    rotated = x.clone()
    ops.rotary_embedding(pos, rotated, None, 128, cache)
    assert torch.equal(rotated, eager)

    h = torch.randn(64, 512, generator=g).to(dtype)
    w = (torch.randn(512, generator=g) + 1).to(dtype)
    hf = h.float()
    eager = w * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    out = torch.empty_like(h)
    ops.rms_norm(out, h, w, 1e-6)
    assert _ulps(out, eager) <= 1 and (out == eager).float().mean() > 0.99

    gu = torch.randn(64, 1024, generator=g).to(dtype)
    eager = torch.nn.functional.silu(gu[:, :512]) * gu[:, 512:]
    out = torch.empty(64, 512, dtype=dtype)
    ops.silu_and_mul(out, gu)
    assert _ulps(out, eager) <= 1 and (out == eager).float().mean() > 0.99


def test_rms_norm_in_place_and_per_head():
    """q/k norms (Qwen3, Gemma 3): a [T, H, D] view of a projection normalised in place with a
    [D] weight; the rest of the projection is untouched."""
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(5, 3 * 4 * 16, generator=g)
    q = qkv[:, :64].view(5, 4, 16)
    w = torch.rand(16, generator=g)
    ref = q.double() * torch.rsqrt(q.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    rest = qkv[:, 64:].clone()
    ops.rms_norm(q, q, w, 1e-6)
    assert torch.allclose(q.double(), ref, atol=1e-5)
    assert torch.equal(qkv[:, 64:], rest)


def test_numpy_arrays_and_flat_rotary_heads():
    x = np.random.default_rng(0).standard_normal((3, 2 * 8)).astype(np.float32)
    cache = cos_sin_cache(16, 8, 10000.0, torch.float32, "cpu").numpy()
    ref = x.copy().reshape(3, 2, 8)
    t = torch.from_numpy(ref.copy())
    ops.rotary_embedding(torch.tensor([0, 5, 15]), t, None, 8, torch.from_numpy(cache))
    ops.rotary_embedding(np.array([0, 5, 15]), x, None, 8, cache)  # [T, H * D], viewed in place
    assert np.allclose(x.reshape(3, 2, 8), t.numpy())
    out = np.empty((3, 8), dtype=np.float32)
    ops.silu_and_mul(out, x)
    assert np.isfinite(out).all()


def test_empty_batches_are_no_ops():
    w = torch.ones(8)
    ops.rms_norm(torch.empty(0, 8), torch.empty(0, 8), w, 1e-6)
    ops.fused_add_rms_norm(torch.empty(0, 8), torch.empty(0, 8), w, 1e-6)
    ops.rotary_embedding(
        torch.empty(0, dtype=torch.long), torch.empty(0, 2, 8), None, 8, torch.zeros(4, 8)
    )
    ops.silu_and_mul(torch.empty(0, 4), torch.empty(0, 8))


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: ops.rms_norm(torch.empty(2, 8), torch.empty(2, 8), torch.ones(7), 1e-6), "weight"),
        (
            lambda: ops.rms_norm(
                torch.empty(2, 8), torch.empty(2, 8, dtype=torch.half), torch.ones(8), 1e-6
            ),
            "out",
        ),
        (
            lambda: ops.rms_norm(torch.empty(2, 8), torch.empty(2, 8).int(), torch.ones(8), 1e-6),
            "input",
        ),
        (
            lambda: ops.rms_norm(torch.empty(2, 8), torch.empty(2, 8), torch.ones(8), float("nan")),
            "epsilon",
        ),
        (
            lambda: ops.rms_norm(
                torch.empty(2, 2, 2, 8), torch.empty(2, 2, 2, 8), torch.ones(8), 1e-6
            ),
            "rank",
        ),
        (
            lambda: ops.rms_norm(torch.empty(4, 8).t(), torch.empty(8, 4), torch.ones(4), 1e-6),
            "contiguous",
        ),
        (
            lambda: ops.fused_add_rms_norm(
                torch.empty(2, 8), torch.empty(3, 8), torch.ones(8), 1e-6
            ),
            "residual",
        ),
        (
            lambda: ops.rotary_embedding(
                torch.tensor([0, 9]), torch.empty(2, 1, 8), None, 8, torch.zeros(9, 8)
            ),
            "positions",
        ),
        (
            lambda: ops.rotary_embedding(
                torch.tensor([0]), torch.empty(1, 1, 8), None, 8, torch.zeros(9, 10)
            ),
            "rotary dim",
        ),
        (
            lambda: ops.rotary_embedding(
                torch.tensor([0]),
                torch.empty(1, 1, 8),
                None,
                8,
                torch.zeros(9, 8, dtype=torch.float64),
            ),
            "cos_sin_cache",
        ),
        (
            lambda: ops.rotary_embedding(
                torch.tensor([0]), torch.empty(1, 1, 8), torch.empty(1, 1, 4), 8, torch.zeros(9, 8)
            ),
            "key",
        ),
        (
            lambda: ops.rotary_embedding(
                torch.tensor([0]), torch.empty(1, 12), None, 8, torch.zeros(9, 8)
            ),
            "head_size",
        ),
        (lambda: ops.silu_and_mul(torch.empty(2, 5), torch.empty(2, 8)), "half"),
        (lambda: ops.gelu_and_mul(torch.empty(2, 4), torch.empty(2, 9)), "even"),
    ],
)
def test_bad_arguments_are_named(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_overlapping_outputs_are_refused():
    buf = torch.zeros(3, 16)
    with pytest.raises(ValueError, match="overlaps"):
        ops.rms_norm(buf[:, 1:9], buf[:, :8], torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match="overlaps"):
        ops.silu_and_mul(buf[:, :8], buf)
    with pytest.raises(ValueError, match="overlaps"):
        ops.fused_add_rms_norm(buf[:, :8], buf[:, :8], torch.ones(8), 1e-6)
    q = torch.zeros(2, 1, 8)
    with pytest.raises(ValueError, match="overlaps"):
        ops.rotary_embedding(torch.tensor([0, 1]), q, q, 8, torch.zeros(4, 8))
    with pytest.raises(ValueError, match="repeats"):
        ops.rms_norm(torch.zeros(1, 8).expand(3, 8), torch.zeros(3, 8), torch.ones(8), 1e-6)
