"""LongRoPE (Phi-3) frequencies against transformers' own rope initialisation: the short factors
while every position of the batch is within the original length, the long ones once any is
past it (HF's rule), through both the eager cos/sin and the fused op."""

from __future__ import annotations

import math

import pytest
from support.deps import need

torch = need("torch")
transformers = need("transformers")

from pagedkv.models.rotary import RotaryEmbedding, apply_rotary  # noqa: E402

HEAD, ORIG, MAX = 64, 64, 256


def _hf_inv_freq(short: list, long: list, seq_len: int) -> tuple[torch.Tensor, float]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = transformers.Phi3Config(
        hidden_size=2 * HEAD,
        num_attention_heads=2,
        max_position_embeddings=MAX,
        original_max_position_embeddings=ORIG,
        rope_parameters={
            "rope_type": "longrope",
            "short_factor": short,
            "long_factor": long,
            "rope_theta": 10000.0,
        },
    )
    return ROPE_INIT_FUNCTIONS["longrope"](cfg, "cpu", seq_len=seq_len)


@pytest.mark.parametrize("longest", [40, 63, 64, 200])
def test_longrope_matches_transformers(longest):
    g = torch.Generator().manual_seed(longest)
    short = (1 + torch.rand(HEAD // 2, generator=g)).tolist()
    long = (2 + 4 * torch.rand(HEAD // 2, generator=g)).tolist()
    inv, attn = _hf_inv_freq(short, long, longest)
    assert attn == pytest.approx(math.sqrt(1 + math.log(MAX / ORIG) / math.log(ORIG)))
    rope = RotaryEmbedding(
        HEAD,
        MAX,
        10000.0,
        {
            "rope_type": "longrope",
            "short_factor": short,
            "long_factor": long,
            "original_max_position_embeddings": ORIG,
        },
    )
    pos = torch.cat([torch.randint(0, longest, (9,), generator=g), torch.tensor([longest - 1])])
    freqs = pos.double()[:, None] * inv.double()[None, :]
    cos, sin = rope.cos_sin(pos)
    assert torch.allclose(cos.double(), freqs.cos() * attn, atol=1e-5)
    assert torch.allclose(sin.double(), freqs.sin() * attn, atol=1e-5)
    q = torch.randn(len(pos), 3, HEAD, generator=g)
    want = apply_rotary(q, cos, sin)
    rope(pos, q, None)  # the fused op over the stacked short | long table
    assert torch.equal(q, want)
