"""M-RoPE (models/mrotary.py) against transformers' Qwen2-VL rotary: random q / k and random
3-component positions, rotated by our fused op (float32) and the eager formula (float64), equal
to HF's Qwen2VLRotaryEmbedding + apply_rotary_pos_emb; [T] positions are plain rope."""

from __future__ import annotations

import pytest
from support.deps import need

torch = need("torch")
need("transformers")

from pagedkv.models.mrotary import MRotaryEmbedding  # noqa: E402
from pagedkv.models.rotary import RotaryEmbedding  # noqa: E402

HEAD_DIM, SECTION, THETA = 32, [4, 6, 6], 10000.0


def _hf_rotate(q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    from transformers import Qwen2VLTextConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import (
        Qwen2VLRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    cfg = Qwen2VLTextConfig(
        hidden_size=64,
        num_attention_heads=2,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": THETA, "mrope_section": SECTION},
    )
    rotary = Qwen2VLRotaryEmbedding(cfg)
    x = q.double().transpose(0, 1)[None]  # [1, H, T, D]
    cos, sin = rotary(x, positions[:, None, :])  # [1, T, D]
    out, _ = apply_rotary_pos_emb(x, x, cos.double(), sin.double())
    return out[0].transpose(0, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mrope_equals_hf(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    t = 23
    q = torch.randn(t, 2, HEAD_DIM, generator=g, dtype=torch.float64)
    positions = torch.randint(0, 200, (3, t), generator=g)
    rotary = MRotaryEmbedding(SECTION, HEAD_DIM, 256, THETA)
    mine_q, mine_k = q.to(dtype).clone(), q[:, :1].to(dtype).clone()
    rope = rotary.bind(positions)
    rope(mine_q, mine_k)
    want = _hf_rotate(q, positions)
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(mine_q.double(), want, atol=tol, rtol=0)
    torch.testing.assert_close(mine_k.double(), want[:, :1], atol=tol, rtol=0)
    # Three equal components are plain rope ([T] positions take that path).
    plain = RotaryEmbedding(HEAD_DIM, 256, THETA)
    a, b = q.float().clone(), q.float().clone()
    rotary.bind(positions[1])(a, None)
    plain(positions[1], b, None)
    torch.testing.assert_close(a, b)
    c = q.float().clone()
    rotary.bind(positions[1][None].expand(3, -1))(c, None)
    torch.testing.assert_close(c, b, atol=1e-5, rtol=0)


def test_sections_must_cover_the_rotary() -> None:
    with pytest.raises(ValueError, match="mrope_section"):
        MRotaryEmbedding([4, 6, 4], HEAD_DIM, 256, THETA)
