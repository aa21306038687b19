"""OPT: learned positions (offset 2), LayerNorm, ReLU, biases everywhere, tied lm_head."""

from __future__ import annotations

from typing import Iterable, Optional, cast

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
from pagedkv.models.linear import (
    ColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from pagedkv.models.pipeline_stage import (
    PPMissingLayer,
    is_first_stage,
    is_last_stage,
    run_stage,
    stage_layers,
)
from pagedkv.models.vocab_embedding import VocabParallelEmbedding

_FUSED = [
    (".q_proj.", ".qkv_proj.", 0),
    (".k_proj.", ".qkv_proj.", 1),
    (".v_proj.", ".qkv_proj.", 2),
]
_POSITION_OFFSET = 2  # OPT's position table starts with two unused rows (a fairseq legacy)


class OPTAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, cache_idx: int) -> None:
        super().__init__()
        self.spec = cfg.attention_spec(layer_idx)
        self.layer_idx = cache_idx  # the layer's KV cache on this rank (pipeline-stage local)
        self.head_dim = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, bias=cfg.attention_bias
        )
        self.num_heads = self.qkv_proj.num_heads  # this rank's
        self.out_proj = RowParallelLinear(cfg.hidden_size, cfg.hidden_size, bias=cfg.attention_bias)

    def forward(self, x: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).view(t, 3, self.num_heads, self.head_dim).unbind(1)
        out = attn.forward(self.layer_idx, q, k, v, self.spec)
        return self.out_proj(out.reshape(t, -1))


class OPTDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, cache_idx: int) -> None:
        super().__init__()
        affine = cfg.layer_norm_elementwise_affine
        self.pre_norm = cfg.do_layer_norm_before
        self.self_attn = OPTAttention(cfg, layer_idx, cache_idx)
        self.self_attn_layer_norm = LayerNorm(cfg.hidden_size, affine=affine)
        self.fc1 = ColumnParallelLinear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.fc2 = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.final_layer_norm = LayerNorm(cfg.hidden_size, affine=affine)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        # OPT-350m normalises after the residual add, every other size before the sublayer.
        h = self.self_attn_layer_norm(x) if self.pre_norm else x
        x = x + self.self_attn(h, attn)
        if not self.pre_norm:
            x = self.self_attn_layer_norm(x)
        h = self.final_layer_norm(x) if self.pre_norm else x
        x = x + self.fc2(self.act(self.fc1(h)))
        return x if self.pre_norm else self.final_layer_norm(x)


class OPTDecoder(nn.Module):
    """On a pipeline stage: the embeddings (and project_in) on the first, the final norm (and
    project_out) on the last, and the stage's range of layers."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        proj = cfg.word_embed_proj_dim or cfg.hidden_size
        first, last = is_first_stage(), is_last_stage()
        missing = PPMissingLayer
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, proj) if first else missing()
        # Learned positions: small, and looked up by position ids, so every rank holds them all.
        self.embed_positions = (
            Embedding(cfg.max_position_embeddings + _POSITION_OFFSET, cfg.hidden_size)
            if first
            else missing()
        )
        self.project_in = (
            ReplicatedLinear(proj, cfg.hidden_size, bias=False)
            if proj != cfg.hidden_size and first
            else None
        )
        self.project_out = (
            ReplicatedLinear(cfg.hidden_size, proj, bias=False)
            if proj != cfg.hidden_size and last
            else None
        )
        has_final = cfg.do_layer_norm_before and not cfg.extra.get("remove_final_layer_norm")
        self.final_layer_norm = (
            LayerNorm(cfg.hidden_size, affine=cfg.layer_norm_elementwise_affine)
            if has_final and last
            else None
        )
        self.layers, self.start_layer, self.end_layer = stage_layers(
            cfg.num_hidden_layers, lambda i, cache_idx: OPTDecoderLayer(cfg, i, cache_idx)
        )


class OPTForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = nn.Module()
        self.model.decoder = OPTDecoder(cfg)
        self.make_head(
            cfg, cfg.word_embed_proj_dim or cfg.hidden_size, self.model.decoder.embed_tokens
        )

    @property
    def decoder(self) -> OPTDecoder:  # typed: nn.Module attributes read as Tensor | Module
        return cast(OPTDecoder, self.model.decoder)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionBackend,
        intermediate: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """As LlamaForCausalLM.forward (``intermediate``: the previous stage's output)."""
        dec = self.decoder

        def embed() -> torch.Tensor:
            x = dec.embed_tokens(input_ids)
            if dec.project_in is not None:
                x = dec.project_in(x)
            return x + dec.embed_positions(positions + _POSITION_OFFSET)

        def finish(x: torch.Tensor) -> torch.Tensor:
            if dec.final_layer_norm is not None:
                x = dec.final_layer_norm(x)
            return dec.project_out(x) if dec.project_out is not None else x

        return run_stage(
            embed,
            intermediate,
            dec.layers[dec.start_layer : dec.end_layer],
            lambda layer, x: layer(x, attn),
            finish,
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        cfg = self.config

        # A tied head on a last stage that is not the first has its own copy of the matrix.
        head_from_embedding = cfg.tie_word_embeddings and not is_first_stage()
        # Modules that exist on some stages only (None where the model has none at all).
        absent = {
            "model.decoder.project_in.": not is_first_stage(),
            "model.decoder.project_out.": not is_last_stage(),
            "model.decoder.final_layer_norm.": not is_last_stage(),
        }

        def rename(name: str) -> Optional[str]:
            if name.startswith("decoder."):  # facebook/opt-* store names without "model."
                name = "model." + name
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                return None
            if name == "model.decoder.embed_tokens.weight" and head_from_embedding:
                return "lm_head.weight" if is_last_stage() else None
            if any(name.startswith(p) and other for p, other in absent.items()):
                return None  # on another pipeline stage
            return name

        written = load_weights_into(self, weights, _FUSED, rename=rename)
        check_all_loaded(self, written, {".qkv_proj.": 3})
