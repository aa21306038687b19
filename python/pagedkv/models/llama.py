"""The Llama family: Llama 2/3, Mistral (sliding window), Qwen2 (q/k/v biases, windows from
max_window_layers on), Qwen3 (q/k RMSNorm), SmolLM2 (tied embeddings), GQA. Phi-3 and Gemma
build on these classes (phi3.py, gemma.py).

Inference only, over a flat batch of tokens: the attention backend separates the sequences and
owns the KV cache. q/k/v and gate/up projections are fused into one matmul each.
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch import nn

from pagedkv.models.attention_backend import AttentionBackend
from pagedkv.models.config import ModelConfig
from pagedkv.models.layers import (
    CausalLM,
    Embedding,
    FusedMapping,
    Linear,
    RMSNorm,
    activation,
    check_all_loaded,
    load_weights_into,
)
from pagedkv.models.rotary import RotaryEmbedding, apply_rotary

_FUSED = [(".q_proj.", ".qkv_proj.", 0), (".k_proj.", ".qkv_proj.", 1),
          (".v_proj.", ".qkv_proj.", 2), (".gate_proj.", ".gate_up_proj.", 0),
          (".up_proj.", ".gate_up_proj.", 1)]


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, unit_offset_norm: bool = False) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.spec = cfg.attention_spec(layer_idx)
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=cfg.attention_bias)
        # Qwen2 alone has q/k/v biases without an o_proj one.
        o_bias = cfg.attention_bias and cfg.causal_architecture != "Qwen2ForCausalLM"
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=o_bias)
        # Qwen3 / Gemma 3: each head's q and k normalised before rotary.
        self.q_norm = self.k_norm = None
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, unit_offset_norm)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, unit_offset_norm)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                attn: AttentionBackend) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        out = attn.forward(self.layer_idx, q, k, v, self.spec)  # [T, Hq, D]
        return self.o_proj(out.reshape(t, self.q_size))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.intermediate = cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size,
                                      bias=cfg.mlp_bias)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(self.act(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, layer_idx)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                attn: AttentionBackend) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, attn)
        return x + self.mlp(self.post_attention_layernorm(x))


def rotary_dim(cfg: ModelConfig) -> int:
    """The dims of each head that rotary turns (all but for partial rotary)."""
    return int(cfg.head_dim * cfg.partial_rotary_factor)


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        # cos/sin are looked up once per forward and shared by all layers.
        self.rotary = RotaryEmbedding(rotary_dim(cfg), cfg.max_position_embeddings,
                                      cfg.rope_theta, cfg.rope_scaling)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(CausalLM):
    # Checkpoint tensors sliced into our fused parameters (Phi-3 stores them fused already).
    fused_weights: FusedMapping = _FUSED
    fused_parts: dict[str, int] = {".qkv_proj.": 3, ".gate_up_proj.": 2}
    model_class: type[nn.Module] = LlamaModel  # Gemma: GemmaModel

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = self.model_class(cfg)
        self.make_head(cfg, cfg.hidden_size, self.model.embed_tokens)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn: AttentionBackend) -> torch.Tensor:
        """input_ids, positions: [T] -> final hidden states [T, hidden] (after the last norm)."""
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.model.rotary.cos_sin(positions)
        # Cast once for all layers (apply_rotary would cast q's and k's copy in every layer:
        # 4 kernels per layer saved, the same values).
        rope = (cos.to(x.dtype), sin.to(x.dtype))
        for layer in self.model.layers:
            x = layer(x, rope, attn)
        return self.model.norm(x)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Loads HF-named tensors (``model.layers.0.self_attn.q_proj.weight``, ...)."""
        cfg = self.config
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim

        def shard_sizes(name: str) -> list[int]:
            return [q, kv, kv] if ".qkv_proj." in name else [cfg.intermediate_size] * 2

        def rename(name: str) -> Optional[str]:
            if "rotary_emb.inv_freq" in name:
                return None
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                return None  # some tied checkpoints store the shared matrix twice
            return name

        written = load_weights_into(self, weights, self.fused_weights, shard_sizes, rename)
        check_all_loaded(self, written, self.fused_parts)
