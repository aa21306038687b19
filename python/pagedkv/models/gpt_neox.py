"""GPT-NeoX / Pythia: LayerNorm, fused q/k/v laid out head by head ([q|k|v] per head), rotary
on the first ``rotary_pct`` of each head's dims, and the parallel residual (attention and MLP
both read the block's input) unless use_parallel_residual is off. Untied ``embed_out`` head."""

from __future__ import annotations

from functools import partial
from typing import Iterable, Optional

import torch
from torch import nn

from pagedkv.models.attention_backend import AttentionBackend
from pagedkv.models.config import ModelConfig
from pagedkv.models.layers import (
    CausalLM,
    LayerNorm,
    activation,
    check_all_loaded,
    load_weights_into,
)
from pagedkv.models.linear import ColumnParallelLinear, RowParallelLinear
from pagedkv.models.llama import Rope, model_rotary
from pagedkv.models.pipeline_stage import (
    first_stage_only,
    is_first_stage,
    is_last_stage,
    last_stage_only,
    run_stage,
    stage_layers,
)
from pagedkv.models.vocab_embedding import VocabParallelEmbedding


class GPTNeoXAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, cache_idx: int) -> None:
        super().__init__()
        self.spec = cfg.attention_spec(layer_idx)
        self.layer_idx = cache_idx
        self.head_dim = cfg.head_dim
        h = cfg.hidden_size
        # Rows grouped by head, so a contiguous column-parallel slice is whole heads.
        self.query_key_value = ColumnParallelLinear(h, 3 * h, bias=cfg.attention_bias)
        self.num_heads = self.query_key_value.output_size_per_partition // (3 * cfg.head_dim)
        self.dense = RowParallelLinear(h, h, bias=cfg.attention_bias)

    def forward(self, x: torch.Tensor, rope: Rope, attn: AttentionBackend) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.query_key_value(x).view(t, self.num_heads, 3 * self.head_dim)
        q, k, v = qkv.split(self.head_dim, dim=-1)
        # Per head [q|k|v]: q's and k's views interleave in memory, which the in-place rotary
        # op refuses; rotate copies.
        q, k = q.contiguous(), k.contiguous()
        rope(q, k)
        out = attn.forward(self.layer_idx, q, k, v, self.spec)
        return self.dense(out.reshape(t, -1))


class GPTNeoXMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.dense_h_to_4h = ColumnParallelLinear(cfg.hidden_size, cfg.intermediate_size)
        self.dense_4h_to_h = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(self.act(self.dense_h_to_4h(x)))


class GPTNeoXLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, cache_idx: int) -> None:
        super().__init__()
        self.parallel = bool(cfg.extra.get("use_parallel_residual", True))
        self.input_layernorm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.post_attention_layernorm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.attention = GPTNeoXAttention(cfg, layer_idx, cache_idx)
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
        self.embed_in = first_stage_only(
            lambda: VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        )
        self.rotary = model_rotary(cfg)
        self.layers, self.start_layer, self.end_layer = stage_layers(
            cfg.num_hidden_layers, lambda i, cache_idx: GPTNeoXLayer(cfg, i, cache_idx)
        )
        self.final_layer_norm = last_stage_only(
            lambda: LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        )


class GPTNeoXForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.gpt_neox = GPTNeoXModel(cfg)
        self.make_head(cfg, cfg.hidden_size, self.gpt_neox.embed_in)  # HF's embed_out

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionBackend,
        intermediate: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """As LlamaForCausalLM.forward (``intermediate``: the previous stage's output)."""
        m = self.gpt_neox
        rope = partial(m.rotary, positions)
        return run_stage(
            lambda: m.embed_in(input_ids),
            intermediate,
            m.layers[m.start_layer : m.end_layer],
            lambda layer, x: layer(x, rope, attn),
            m.final_layer_norm,
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        cfg = self.config
        head_from_embedding = cfg.tie_word_embeddings and not is_first_stage()

        def rename(name: str) -> Optional[str]:
            if name.endswith((".attention.bias", ".attention.masked_bias", ".inv_freq")):
                return None  # mask and rotary buffers of older checkpoints
            if name in ("embed_out.weight", "lm_head.weight"):
                return None if cfg.tie_word_embeddings else "lm_head.weight"
            if name == "gpt_neox.embed_in.weight" and head_from_embedding:
                return "lm_head.weight" if is_last_stage() else None
            return name

        written = load_weights_into(self, weights, [], rename=rename)
        check_all_loaded(self, written, {})
