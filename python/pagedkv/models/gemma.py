"""Gemma 2 and Gemma 3 (text): Llama's attention and gated MLP (GeGLU) with Gemma's own parts —
``(1 + w)`` RMSNorms before and after each sublayer, embeddings scaled by sqrt(hidden), a query
scale from query_pre_attn_scalar, soft-capped attention and final logits (Gemma 2), sliding and
global layers alternating, and (Gemma 3) q/k norms and a rope base of their own for the
sliding layers."""

from __future__ import annotations

from functools import partial
from typing import Callable, Optional

import torch
from torch import nn

from pagedkv.models.attention_backend import AttentionBackend
from pagedkv.models.config import ModelConfig
from pagedkv.models.layers import RMSNorm
from pagedkv.models.llama import (
    LlamaAttention,
    LlamaForCausalLM,
    LlamaMLP,
    Rope,
    model_rotary,
    rotary_dim,
)
from pagedkv.models.pipeline_stage import first_stage_only, last_stage_only, stage_layers
from pagedkv.models.rotary import RotaryEmbedding
from pagedkv.models.vocab_embedding import VocabParallelEmbedding


class GemmaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, cache_idx: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, layer_idx, cache_idx, norm_offset=1.0)
        self.mlp = LlamaMLP(cfg)
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(h, eps, weight_offset=1.0)
        self.post_attention_layernorm = RMSNorm(h, eps, weight_offset=1.0)
        self.pre_feedforward_layernorm = RMSNorm(h, eps, weight_offset=1.0)
        self.post_feedforward_layernorm = RMSNorm(h, eps, weight_offset=1.0)
        # Gemma 3's sliding layers turn q/k with the local rope (GemmaModel.rotary_local).
        self.local_rope = (
            cfg.rope_local_theta is not None and cfg.layer_sliding_window(layer_idx) is not None
        )

    def forward(
        self, x: torch.Tensor, residual: Optional[torch.Tensor], rope: Rope, attn: AttentionBackend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As ResidualStreamLayer.forward, each sublayer's output normalised once more before it
        joins the residual stream."""
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.post_attention_layernorm(self.self_attn(x, rope, attn))
        x, residual = self.pre_feedforward_layernorm(x, residual)
        return self.post_feedforward_layernorm(self.mlp(x)), residual


class GemmaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = first_stage_only(
            lambda: VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        )
        self.rotary = model_rotary(cfg)
        # Gemma 3: the sliding layers' rope has its own base and no scaling.
        dim, max_pos = rotary_dim(cfg), cfg.max_position_embeddings
        self.rotary_local = (
            RotaryEmbedding(cfg.head_dim, max_pos, cfg.rope_local_theta, None, dim)
            if cfg.rope_local_theta is not None
            else None
        )
        self.layers, self.start_layer, self.end_layer = stage_layers(
            cfg.num_hidden_layers, lambda i, cache_idx: GemmaDecoderLayer(cfg, i, cache_idx)
        )
        self.norm = last_stage_only(
            lambda: RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, weight_offset=1.0)
        )


class GemmaForCausalLM(LlamaForCausalLM):
    """Gemma2ForCausalLM / Gemma3ForCausalLM: Llama's forward and checkpoint names (plus the
    extra norms), Gemma's embedding scale, ropes and final soft cap."""

    model_class = GemmaModel

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.final_logit_softcap = float(cfg.final_logit_softcapping or 0.0)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        # The normaliser is rounded to the model dtype first, as in the reference.
        return x * torch.tensor(self.config.hidden_size**0.5, dtype=x.dtype)

    def layer_ropes(self, positions: torch.Tensor) -> Callable[[nn.Module], Rope]:
        m = self.model
        full = partial(m.rotary, positions)
        local = partial(m.rotary_local, positions) if m.rotary_local is not None else full
        return lambda layer: local if getattr(layer, "local_rope", False) else full
