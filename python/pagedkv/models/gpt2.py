"""GPT-2: learned positions, pre-LayerNorm blocks, fused q/k/v (``c_attn``), GELU (tanh) MLP,
biases everywhere, lm_head tied to the token embedding. The checkpoint's Conv1D weights are
stored [in, out]: transposed once at load into our [out, in] linear layers."""

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
    activation,
    check_all_loaded,
    load_weights_into,
)
from pagedkv.models.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from pagedkv.models.pipeline_stage import (
    first_stage_only,
    is_first_stage,
    is_last_stage,
    last_stage_only,
    run_stage,
    stage_layers,
)
from pagedkv.models.vocab_embedding import VocabParallelEmbedding

_CONV1D = (".c_attn.weight", ".c_proj.weight", ".c_fc.weight")


class GPT2Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, cache_idx: int) -> None:
        super().__init__()
        self.spec = cfg.attention_spec(layer_idx)
        self.layer_idx = cache_idx
        self.head_dim = cfg.head_dim
        # c_attn's rows are [q | k | v], each all heads: QKVParallelLinear's fused-tensor form.
        self.c_attn = QKVParallelLinear(cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads)
        self.num_heads = self.c_attn.num_heads  # this rank's
        self.c_proj = RowParallelLinear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.c_attn(x).view(t, 3, self.num_heads, self.head_dim).unbind(1)
        return self.c_proj(attn.forward(self.layer_idx, q, k, v, self.spec).reshape(t, -1))


class GPT2MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.c_fc = ColumnParallelLinear(cfg.hidden_size, cfg.intermediate_size)
        self.c_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, cache_idx: int) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.attn = GPT2Attention(cfg, layer_idx, cache_idx)
        self.ln_2 = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.mlp = GPT2MLP(cfg)

    def forward(self, x: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), attn)
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    """On a pipeline stage: the embeddings on the first, ln_f on the last."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.wte = first_stage_only(lambda: VocabParallelEmbedding(cfg.vocab_size, h))
        # Learned positions: small, and looked up by position ids: every rank holds them all.
        self.wpe = first_stage_only(lambda: Embedding(cfg.max_position_embeddings, h))
        self.h, self.start_layer, self.end_layer = stage_layers(
            cfg.num_hidden_layers, lambda i, cache_idx: GPT2Block(cfg, i, cache_idx)
        )
        self.ln_f = last_stage_only(lambda: LayerNorm(h, cfg.layer_norm_eps))


class GPT2LMHeadModel(CausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.transformer = GPT2Model(cfg)
        self.make_head(cfg, cfg.hidden_size, self.transformer.wte)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionBackend,
        intermediate: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """As LlamaForCausalLM.forward (``intermediate``: the previous stage's output)."""
        m = self.transformer
        return run_stage(
            lambda: m.wte(input_ids) + m.wpe(positions),
            intermediate,
            m.h[m.start_layer : m.end_layer],
            lambda block, x: block(x, attn),
            m.ln_f,
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        cfg = self.config
        head_from_embedding = cfg.tie_word_embeddings and not is_first_stage()

        def rename(name: str) -> Optional[str]:
            if name.endswith((".attn.bias", ".attn.masked_bias")):
                return None  # causal-mask buffers of older checkpoints
            if not name.startswith(("transformer.", "lm_head.", "score.")):
                name = "transformer." + name  # the original gpt2 files have no prefix
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                return None
            if name == "transformer.wte.weight" and head_from_embedding:
                return "lm_head.weight" if is_last_stage() else None
            return name

        written = load_weights_into(self, _transposed(weights), [], rename=rename)
        check_all_loaded(self, written, {})


def _transposed(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in weights:
        yield name, (tensor.t() if name.endswith(_CONV1D) else tensor)
