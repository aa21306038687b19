"""The Llama family: Llama 2/3, Mistral (sliding window), Qwen2 (q/k/v biases, windows from
max_window_layers on), Qwen3 (q/k RMSNorm), SmolLM2 (tied embeddings), GQA. Phi-3 and Gemma
build on these classes (phi3.py, gemma.py).

Inference only, over a flat batch of tokens: the attention backend separates the sequences and
owns the KV cache. q/k/v and gate/up projections are fused into one matmul each.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Iterable, Optional

import torch
from torch import nn

from pagedkv.models.attention_backend import AttentionBackend
from pagedkv.models.config import ModelConfig
from pagedkv.models.layers import (
    CausalLM,
    FusedMapping,
    RMSNorm,
    act_and_mul,
    check_all_loaded,
    load_weights_into,
)
from pagedkv.models.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from pagedkv.models.moe import sparse_moe_block
from pagedkv.models.pipeline_stage import (
    first_stage_only,
    is_first_stage,
    is_last_stage,
    last_stage_only,
    stage_input,
    stage_layers,
)
from pagedkv.models.rotary import RotaryEmbedding
from pagedkv.models.vocab_embedding import VocabParallelEmbedding

# Rotates a layer's q [T, Hq, D] and k [T, Hk, D] in place (the step's positions are bound).
Rope = Callable[[torch.Tensor, torch.Tensor], object]

_FUSED = [
    (".q_proj.", ".qkv_proj.", 0),
    (".k_proj.", ".qkv_proj.", 1),
    (".v_proj.", ".qkv_proj.", 2),
    (".gate_proj.", ".gate_up_proj.", 0),
    (".up_proj.", ".gate_up_proj.", 1),
]


class LlamaAttention(nn.Module):
    """This rank's heads (all of them with one tensor-parallel rank)."""

    def __init__(
        self, cfg: ModelConfig, layer_idx: int, cache_idx: int, norm_offset: float = 0.0
    ) -> None:
        super().__init__()
        self.spec = cfg.attention_spec(layer_idx)  # by the model's (global) layer index
        self.layer_idx = cache_idx  # the layer's KV cache on this rank (pipeline-stage local)
        self.head_dim = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size,
            cfg.head_dim,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            bias=cfg.attention_bias,
        )
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        # Qwen2 (and Qwen2-MoE) have q/k/v biases without an o_proj one.
        o_bias = cfg.attention_bias and cfg.causal_architecture not in (
            "Qwen2ForCausalLM",
            "Qwen2MoeForCausalLM",
        )
        self.o_proj = RowParallelLinear(
            cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, bias=o_bias
        )
        # Qwen3 / Gemma 3: each head's q and k normalised before rotary (Gemma: 1 + w).
        self.q_norm = self.k_norm = None
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, norm_offset)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, norm_offset)

    def forward(self, x: torch.Tensor, rope: Rope, attn: AttentionBackend) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        rope(q, k)  # in place (on the views of the qkv projection, or the normed copies)
        out = attn.forward(self.layer_idx, q, k, v, self.spec)  # [T, Hq, D]
        return self.o_proj(out.reshape(t, self.q_size))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            cfg.hidden_size, [cfg.intermediate_size] * 2, bias=cfg.mlp_bias
        )
        self.intermediate = self.gate_up_proj.output_size_per_partition // 2
        self.down_proj = RowParallelLinear(
            cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias
        )
        self.act_and_mul = act_and_mul(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_and_mul(self.gate_up_proj(x)))


class ResidualStreamLayer(nn.Module):
    """A pre-norm decoder layer (input_layernorm, self_attn, post_attention_layernorm, mlp)
    whose residual stream rides beside it: Llama's and DeepSeek's."""

    input_layernorm: RMSNorm
    post_attention_layernorm: RMSNorm
    self_attn: nn.Module
    mlp: nn.Module

    def forward(
        self, x: torch.Tensor, residual: Optional[torch.Tensor], rope: Rope, attn: AttentionBackend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream rides beside the block (vLLM's form): each norm adds the previous
        block's output into it in place (fused_add_rms_norm), the same sums as HF's
        ``x = x + block(norm(x))``. Returns (this layer's MLP output, residual)."""
        if residual is None:  # first layer: the embeddings are the residual
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, rope, attn)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaDecoderLayer(ResidualStreamLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, cache_idx: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, layer_idx, cache_idx)
        # Mixtral / Qwen-MoE: a sparse MoE block where the config makes the layer sparse
        # (decided by the model's layer index, which differs from cache_idx on later stages).
        moe = sparse_moe_block(cfg, layer_idx)
        self.mlp = moe if moe is not None else LlamaMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


def rotary_dim(cfg: ModelConfig) -> int:
    """The dims of each head that rotary turns (all but for partial rotary)."""
    return int(cfg.head_dim * cfg.partial_rotary_factor)


def model_rotary(cfg: ModelConfig) -> RotaryEmbedding:
    """The model's rotary as its config describes it (base, scaling, partial rotary)."""
    return RotaryEmbedding(
        cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling, rotary_dim(cfg)
    )


class LlamaModel(nn.Module):
    """On a pipeline stage: the embedding on the first, the final norm on the last, and the
    stage's range of layers (the others are placeholders)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = first_stage_only(
            lambda: VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        )
        # cos/sin are looked up once per forward and shared by all layers.
        self.rotary = model_rotary(cfg)
        self.layers, self.start_layer, self.end_layer = stage_layers(
            cfg.num_hidden_layers, lambda i, cache_idx: LlamaDecoderLayer(cfg, i, cache_idx)
        )
        self.norm = last_stage_only(lambda: RMSNorm(cfg.hidden_size, cfg.rms_norm_eps))


class LlamaForCausalLM(CausalLM):
    # Checkpoint tensors loaded into our fused parameters part by part (Phi-3 stores them fused).
    fused_weights: FusedMapping = _FUSED
    fused_parts: dict[str, int] = {".qkv_proj.": 3, ".gate_up_proj.": 2}
    model_class: type[nn.Module] = LlamaModel  # Gemma: GemmaModel
    model: Any  # an instance of model_class

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = self.model_class(cfg)
        self.make_head(cfg, cfg.hidden_size, self.model.embed_tokens)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def layer_ropes(self, positions: torch.Tensor) -> Callable[[nn.Module], Rope]:
        """layer -> its rotary (bound to the step's positions): one for every layer here."""
        rope = partial(self.model.rotary, positions)
        return lambda _: rope

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionBackend,
        intermediate: Optional[torch.Tensor] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """input_ids, positions: [T] -> final hidden states [T, hidden] (after the last norm).
        On a pipeline stage after the first, ``intermediate`` holds the previous stage's output
        (the residual stream: each layer adds to it) and the input ids are not read; a stage
        before the last returns its residual stream, un-normalised. ``inputs_embeds`` [T,
        hidden]: the first layer's input given (image rows merged in), embed_tokens skipped."""
        m = self.model
        if inputs_embeds is not None:
            x = inputs_embeds
        elif is_first_stage():
            x = self.embed(input_ids)
        else:
            x = stage_input(intermediate, "hidden states")
        rope_of = self.layer_ropes(positions)
        residual: Optional[torch.Tensor] = None
        for layer in m.layers[m.start_layer : m.end_layer]:
            x, residual = layer(x, residual, rope_of(layer), attn)
        if not is_last_stage():  # hand the whole residual stream to the next stage
            return x if residual is None else x + residual
        if residual is None:  # no layers
            return m.norm(x)
        return m.norm(x, residual)[0]

    def load_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        loaded_elsewhere: Optional[set[str]] = None,
    ) -> None:
        """Loads HF-named tensors (``model.layers.0.self_attn.q_proj.weight``, ...).
        ``loaded_elsewhere``: parameters a subclass fills itself while ``weights`` is consumed
        (the MoE experts), counted as loaded."""
        cfg = self.config
        # A tied head on a last stage that is not the first has its own copy of the matrix.
        head_from_embedding = cfg.tie_word_embeddings and not is_first_stage()

        def rename(name: str) -> Optional[str]:
            if not name.startswith(("model.", "lm_head.", "score.")):
                # A bare LlamaModel's tensors (sentence-transformers saves them so; some
                # embedding checkpoints, Qwen3-Embedding's, keep a *ForCausalLM config).
                name = "model." + name
            if "rotary_emb.inv_freq" in name:
                return None
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                return None  # some tied checkpoints store the shared matrix twice
            if name == "model.embed_tokens.weight" and head_from_embedding:
                return "lm_head.weight" if is_last_stage() else None
            return name

        written = load_weights_into(self, weights, self.fused_weights, rename=rename)
        check_all_loaded(self, written | (loaded_elsewhere or set()), self.fused_parts)
