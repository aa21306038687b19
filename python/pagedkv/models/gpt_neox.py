"""GPT-NeoX / Pythia: LayerNorm, fused q/k/v laid out head by head ([q|k|v] per head), rotary
on the first ``rotary_pct`` of each head's dims, and the parallel residual (attention and MLP
both read the block's input) unless use_parallel_residual is off. Untied ``embed_out`` head."""

from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch import nn

from pagedkv.models.attention_backend import AttentionBackend
from pagedkv.models.config import ModelConfig
from pagedkv.models.layers import (
    CausalLM,
    Embedding,
    LayerNorm,
    Linear,
    activation,
    check_all_loaded,
    load_weights_into,
)
from pagedkv.models.llama import rotary_dim
from pagedkv.models.rotary import RotaryEmbedding, apply_rotary

Rope = tuple[torch.Tensor, torch.Tensor]


class GPTNeoXAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.spec = cfg.attention_spec(layer_idx)
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        h = cfg.hidden_size
        self.query_key_value = Linear(h, 3 * h, bias=cfg.attention_bias)
        self.dense = Linear(h, h, bias=cfg.attention_bias)

    def forward(self, x: torch.Tensor, rope: Rope, attn: AttentionBackend) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.query_key_value(x).view(t, self.num_heads, 3 * self.head_dim)
        q, k, v = qkv.split(self.head_dim, dim=-1)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        out = attn.forward(self.layer_idx, q.contiguous(), k.contiguous(), v.contiguous(),
                           self.spec)
        return self.dense(out.reshape(t, -1))


class GPTNeoXMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.dense_h_to_4h = Linear(cfg.hidden_size, cfg.intermediate_size)
        self.dense_4h_to_h = Linear(cfg.intermediate_size, cfg.hidden_size)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(self.act(self.dense_h_to_4h(x)))


class GPTNeoXLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.parallel = bool(cfg.extra.get("use_parallel_residual", True))
        self.input_layernorm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.post_attention_layernorm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.attention = GPTNeoXAttention(cfg, layer_idx)
        self.mlp = GPTNeoXMLP(cfg)

    def forward(self, x: torch.Tensor, rope: Rope, attn: AttentionBackend) -> torch.Tensor:
        a = self.attention(self.input_layernorm(x), rope, attn)
        if self.parallel:  # x + attn(ln1(x)) + mlp(ln2(x))
            return x + a + self.mlp(self.post_attention_layernorm(x))
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x))


class GPTNeoXModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_in = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary = RotaryEmbedding(rotary_dim(cfg), cfg.max_position_embeddings,
                                      cfg.rope_theta, cfg.rope_scaling)
        self.layers = nn.ModuleList(GPTNeoXLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.final_layer_norm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)


class GPTNeoXForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.gpt_neox = GPTNeoXModel(cfg)
        self.make_head(cfg, cfg.hidden_size, self.gpt_neox.embed_in)  # HF's embed_out

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn: AttentionBackend) -> torch.Tensor:
        m = self.gpt_neox
        x = m.embed_in(input_ids)
        cos, sin = m.rotary.cos_sin(positions)
        rope = (cos.to(x.dtype), sin.to(x.dtype))
        for layer in m.layers:
            x = layer(x, rope, attn)
        return m.final_layer_norm(x)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        cfg = self.config

        def rename(name: str) -> Optional[str]:
            if name.endswith((".attention.bias", ".attention.masked_bias", ".inv_freq")):
                return None  # mask and rotary buffers of older checkpoints
            if name == "embed_out.weight":
                return None if cfg.tie_word_embeddings else "lm_head.weight"
            return name

        written = load_weights_into(self, weights, [], lambda _: [], rename)
        check_all_loaded(self, written, {})
