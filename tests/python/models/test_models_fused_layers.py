"""The model layers on the fused ops (models/layers.py, models/rotary.py) against the eager
formulas they replaced: rotary bit for bit, norms and activations within an ulp, partial /
GPT-J rotary and Gemma's offset norm included."""

from __future__ import annotations

import pytest
from support.deps import need

torch = need("torch")

from pagedkv.models import layers  # noqa: E402
from pagedkv.models.layers import RMSNorm, act_and_mul, activation  # noqa: E402
from pagedkv.models.rotary import RotaryEmbedding, apply_rotary  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    # One ulp of the dtype at the values' scale (fp32: reduction order only).
    tol = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[a.dtype]
    return bool(((a.float() - b.float()).abs() <= tol * b.float().abs().clamp(min=1)).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "rotary_dim,is_neox,scaling",
    [
        (None, True, None),
        (16, True, None),
        (None, False, None),
        (24, False, None),
        (
            None,
            True,
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
        (None, True, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
    ],
)
def test_rotary_forward_is_the_eager_formula(dtype, rotary_dim, is_neox, scaling):
    rope = RotaryEmbedding(64, 256, 10000.0, scaling, rotary_dim=rotary_dim, is_neox=is_neox)
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(9, (4 + 2 + 2) * 64, generator=g).to(dtype)
    q, k = qkv[:, :256].view(9, 4, 64), qkv[:, 256:384].view(9, 2, 64)
    pos = torch.randint(0, 256, (9,), generator=g)
    cos, sin = rope.cos_sin(pos)
    want_q = apply_rotary(q, cos, sin, rope.rotary_dim, is_neox)
    want_k = apply_rotary(k, cos, sin, rope.rotary_dim, is_neox)
    v = qkv[:, 384:].clone()
    rope(pos, q, k)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    assert torch.equal(qkv[:, 384:], v)


def test_dynamic_rope_past_the_trained_length_uses_its_own_table():
    rope = RotaryEmbedding(32, 16, 10000.0, {"rope_type": "dynamic", "factor": 2.0})
    q = torch.randn(40, 2, 32)
    pos = torch.arange(40)
    cos, sin = rope.cos_sin(pos)
    want = apply_rotary(q, cos, sin)
    rope(pos, q, None)
    assert torch.allclose(q, want, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_and_residual_form_match_eager(dtype, offset):
    norm = RMSNorm(96, 1e-6, weight_offset=offset)
    g = torch.Generator().manual_seed(1)
    norm.weight.data = (torch.randn(96, generator=g) * 0.3 + 1).to(dtype)
    x, res = (torch.randn(7, 96, generator=g).to(dtype) for _ in range(2))
    assert _close(norm(x), norm._eager(x))
    total = x + res
    out, new_res = norm(x.clone(), res.clone())
    assert torch.equal(new_res, total)
    assert _close(out, norm._eager(total))


@pytest.mark.parametrize("name", ["silu", "gelu", "gelu_pytorch_tanh", "relu"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_act_and_mul_matches_eager(name, dtype):
    x = torch.randn(5, 3, 2 * 40, generator=torch.Generator().manual_seed(2)).to(dtype)
    gate, up = x.split(40, dim=-1)
    assert _close(act_and_mul(name)(x), activation(name)(gate) * up)


def test_refused_dtypes_fall_back_to_the_eager_math():
    """float64 is no dtype of the ops: the layers compute it eagerly instead of failing."""
    assert not layers.fused_ok(torch.zeros(2, dtype=torch.float64))
    assert not layers.fused_ok(torch.zeros(2, 2, 2, 8))  # rank 4: more than the ops' rows
    assert not layers.fused_ok(torch.zeros(8, 4).t())  # strided last dimension
    x4 = torch.randn(2, 3, 4, 8)
    norm4 = RMSNorm(8, 1e-6)
    norm4.weight.data = torch.rand(8)
    assert torch.equal(norm4(x4), norm4._eager(x4))
    norm = RMSNorm(8, 1e-6)
    norm.weight.data = torch.rand(8, dtype=torch.float64)
    x = torch.randn(3, 8, dtype=torch.float64)
    assert torch.equal(norm(x), norm._eager(x))
    q = torch.randn(3, 2, 8, dtype=torch.float64)
    rope = RotaryEmbedding(8, 16, 10000.0)
    cos, sin = rope.cos_sin(torch.arange(3))
    want = apply_rotary(q, cos, sin)
    rope(torch.arange(3), q, None)
    assert torch.equal(q, want)
