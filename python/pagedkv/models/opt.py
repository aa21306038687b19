"""OPT: learned positions (offset 2), LayerNorm, ReLU, biases everywhere, tied lm_head."""

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

_FUSED = [(".q_proj.", ".qkv_proj.", 0), (".k_proj.", ".qkv_proj.", 1),
          (".v_proj.", ".qkv_proj.", 2)]
_POSITION_OFFSET = 2  # OPT's position table starts with two unused rows (a fairseq legacy)


class OPTAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.spec = cfg.attention_spec(layer_idx)
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=cfg.attention_bias)
        self.out_proj = Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.attention_bias)

    def forward(self, x: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).view(t, 3, self.num_heads, self.head_dim).unbind(1)
        out = attn.forward(self.layer_idx, q, k, v, self.spec)
        return self.out_proj(out.reshape(t, -1))


class OPTDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        affine = cfg.layer_norm_elementwise_affine
        self.pre_norm = cfg.do_layer_norm_before
        self.self_attn = OPTAttention(cfg, layer_idx)
        self.self_attn_layer_norm = LayerNorm(cfg.hidden_size, affine=affine)
        self.fc1 = Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.fc2 = Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
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
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        proj = cfg.word_embed_proj_dim or cfg.hidden_size
        self.embed_tokens = Embedding(cfg.vocab_size, proj)
        self.embed_positions = Embedding(cfg.max_position_embeddings + _POSITION_OFFSET,
                                            cfg.hidden_size)
        self.project_in = Linear(proj, cfg.hidden_size, bias=False) \
            if proj != cfg.hidden_size else None
        self.project_out = Linear(cfg.hidden_size, proj, bias=False) \
            if proj != cfg.hidden_size else None
        has_final = cfg.do_layer_norm_before and not cfg.extra.get("remove_final_layer_norm")
        self.final_layer_norm = LayerNorm(
            cfg.hidden_size, affine=cfg.layer_norm_elementwise_affine) if has_final else None
        self.layers = nn.ModuleList(OPTDecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))


class OPTForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = nn.Module()
        self.model.decoder = OPTDecoder(cfg)
        self.make_head(cfg, cfg.word_embed_proj_dim or cfg.hidden_size,
                       self.model.decoder.embed_tokens)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn: AttentionBackend) -> torch.Tensor:
        dec = self.model.decoder
        x = dec.embed_tokens(input_ids)
        if dec.project_in is not None:
            x = dec.project_in(x)
        x = x + dec.embed_positions(positions + _POSITION_OFFSET)
        for layer in dec.layers:
            x = layer(x, attn)
        if dec.final_layer_norm is not None:
            x = dec.final_layer_norm(x)
        return dec.project_out(x) if dec.project_out is not None else x

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        cfg = self.config

        def rename(name: str) -> Optional[str]:
            if name.startswith("decoder."):  # facebook/opt-* store names without "model."
                name = "model." + name
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                return None
            return name

        written = load_weights_into(self, weights, _FUSED,
                                    lambda _: [cfg.hidden_size] * 3, rename)
        check_all_loaded(self, written, {".qkv_proj.": 3})
