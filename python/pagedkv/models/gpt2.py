"""GPT-2: learned positions, pre-LayerNorm blocks, fused q/k/v (``c_attn``), GELU (tanh) MLP,
biases everywhere, lm_head tied to the token embedding. The checkpoint's Conv1D weights are
stored [in, out]: transposed once at load into our [out, in] Linear."""

from __future__ import annotations

from typing import Iterable, Iterator, Optional

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

_CONV1D = (".c_attn.weight", ".c_proj.weight", ".c_fc.weight")


class GPT2Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.spec = cfg.attention_spec(layer_idx)
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.c_attn = Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.c_proj = Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.c_attn(x).view(t, 3, self.num_heads, self.head_dim).unbind(1)
        return self.c_proj(attn.forward(self.layer_idx, q, k, v, self.spec).reshape(t, -1))


class GPT2MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.c_fc = Linear(cfg.hidden_size, cfg.intermediate_size)
        self.c_proj = Linear(cfg.intermediate_size, cfg.hidden_size)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.attn = GPT2Attention(cfg, layer_idx)
        self.ln_2 = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.mlp = GPT2MLP(cfg)

    def forward(self, x: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), attn)
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.wte = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.wpe = Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.h = nn.ModuleList(GPT2Block(cfg, i) for i in range(cfg.num_hidden_layers))
        self.ln_f = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)


class GPT2LMHeadModel(CausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.transformer = GPT2Model(cfg)
        self.make_head(cfg, cfg.hidden_size, self.transformer.wte)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn: AttentionBackend) -> torch.Tensor:
        m = self.transformer
        x = m.wte(input_ids) + m.wpe(positions)
        for block in m.h:
            x = block(x, attn)
        return m.ln_f(x)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        cfg = self.config

        def rename(name: str) -> Optional[str]:
            if name.endswith((".attn.bias", ".attn.masked_bias")):
                return None  # causal-mask buffers of older checkpoints
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                return None
            if not name.startswith(("transformer.", "lm_head.", "score.")):
                name = "transformer." + name  # the original gpt2 files have no prefix
            return name

        written = load_weights_into(self, _transposed(weights), [], lambda _: [], rename)
        check_all_loaded(self, written, {})


def _transposed(weights: Iterable[tuple[str, torch.Tensor]]
                ) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in weights:
        yield name, (tensor.t() if name.endswith(_CONV1D) else tensor)
