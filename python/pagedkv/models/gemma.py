"""Gemma 2 and Gemma 3 (text): Llama's attention and gated MLP (GeGLU) with Gemma's own parts —
``(1 + w)`` RMSNorms before and after each sublayer, embeddings scaled by sqrt(hidden), a query
scale from query_pre_attn_scalar, soft-capped attention and final logits (Gemma 2), sliding and
global layers alternating, and (Gemma 3) q/k norms and a rope base of their own for the
sliding layers."""

from __future__ import annotations

import torch
from torch import nn

from pagedkv.models.attention_backend import AttentionBackend
from pagedkv.models.config import ModelConfig
from pagedkv.models.layers import Embedding, RMSNorm
from pagedkv.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, rotary_dim
from pagedkv.models.rotary import RotaryEmbedding

Rope = tuple[torch.Tensor, torch.Tensor]


class GemmaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, layer_idx, unit_offset_norm=True)
        self.mlp = LlamaMLP(cfg)
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(h, eps, unit_offset=True)
        self.post_attention_layernorm = RMSNorm(h, eps, unit_offset=True)
        self.pre_feedforward_layernorm = RMSNorm(h, eps, unit_offset=True)
        self.post_feedforward_layernorm = RMSNorm(h, eps, unit_offset=True)
        # Gemma 3's sliding layers turn q/k with the local rope (GemmaModel.ropes[1]).
        self.local_rope = cfg.rope_local_theta is not None and \
            cfg.layer_sliding_window(layer_idx) is not None

    def forward(self, x: torch.Tensor, ropes: tuple[Rope, Rope], attn: AttentionBackend
                ) -> torch.Tensor:
        rope = ropes[1] if self.local_rope else ropes[0]
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), rope, attn))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class GemmaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        dim, max_pos = rotary_dim(cfg), cfg.max_position_embeddings
        self.rotary = RotaryEmbedding(dim, max_pos, cfg.rope_theta, cfg.rope_scaling)
        # Gemma 3: the sliding layers' rope has its own base and no scaling.
        self.rotary_local = RotaryEmbedding(dim, max_pos, cfg.rope_local_theta) \
            if cfg.rope_local_theta is not None else None
        self.layers = nn.ModuleList(GemmaDecoderLayer(cfg, i)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, unit_offset=True)


class GemmaForCausalLM(LlamaForCausalLM):
    """Gemma2ForCausalLM / Gemma3ForCausalLM (checkpoint names as Llama's, plus the extra norms:
    LlamaForCausalLM.load_weights reads them)."""

    model_class = GemmaModel

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.final_logit_softcap = float(cfg.final_logit_softcapping or 0.0)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn: AttentionBackend) -> torch.Tensor:
        m = self.model
        x = m.embed_tokens(input_ids)
        # The normaliser is rounded to the model dtype first, as in the reference.
        x = x * torch.tensor(self.config.hidden_size ** 0.5, dtype=x.dtype)
        ropes = (_rope(m.rotary, positions, x.dtype),
                 _rope(m.rotary_local or m.rotary, positions, x.dtype))
        for layer in m.layers:
            x = layer(x, ropes, attn)
        return m.norm(x)


def _rope(rotary: RotaryEmbedding, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
    cos, sin = rotary.cos_sin(positions)
    return cos.to(dtype), sin.to(dtype)
