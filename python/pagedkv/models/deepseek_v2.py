"""DeepSeek-V2 and DeepSeek-V3 (DeepseekV2ForCausalLM / DeepseekV3ForCausalLM): multi-head
latent attention (MLA) and MoE layers with shared experts and group-limited routing.

Attention. Queries come from the hidden state directly (``q_proj``) or through a low-rank
bottleneck (``q_a_proj`` -> RMSNorm -> ``q_b_proj`` when ``q_lora_rank`` is set). Keys and
values come from one latent per token: ``kv_a_proj_with_mqa`` gives a ``kv_lora_rank`` latent
(RMSNorm'ed) and a ``qk_rope_head_dim`` rotary key shared by all heads; ``kv_b_proj`` expands the
latent into each head's non-rotary key part (``qk_nope_head_dim``) and value (``v_head_dim``).
Rotary turns only the rope part of q and k, in (2i, 2i + 1) pairs (V2's complex rotation, V3's
rope_interleave; V3 without it: rotate_half pairs), with YaRN's mscale in the softmax scale as
transformers computes it (config.py).

KV cache: what is stored is the *decompressed* per-head key [k_nope | k_rope] and value, both
zero-padded to the larger head size (the paged kernels take one head size for K and V; the zero
columns add nothing to q.k nor to the output), in the same paged cache as every other family.
The latent-cache ("absorbed") form of MLA, which stores only the kv_lora_rank + rope latent per
token and folds kv_b_proj into the query and output projections, is not done: it needs attention
kernels over a single shared latent head of size kv_lora_rank + rope (576 for the released
models) with a value that is a prefix of the key, which the paged ops do not have; the
decompressed form costs heads * 2 * head_size cache elements per token instead of 576, and is
exact. A head size the kernels lack (ops.SUPPORTED_HEAD_SIZES) is refused when the engine loads
the model.

MoE. Layers from ``first_k_dense_replace`` on are sparse: a float32 router (moe_routing.py),
the routed experts in one grouped GEMM per projection (moe.FusedMoE) and ``n_shared_experts``
always-on experts fused into one MLP, added ungated. Earlier layers have a dense gated MLP.
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from pagedkv.models.attention_backend import AttentionBackend
from pagedkv.models.config import ModelConfig
from pagedkv.models.layers import RMSNorm
from pagedkv.models.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from pagedkv.models.llama import LlamaForCausalLM, ResidualStreamLayer, Rope
from pagedkv.models.moe import FusedMoE, GatedMLP, MoEConfig, split_expert_weights
from pagedkv.models.moe_routing import grouped_topk
from pagedkv.models.pipeline_stage import first_stage_only, last_stage_only, stage_layers
from pagedkv.models.rotary import RotaryEmbedding
from pagedkv.models.vocab_embedding import VocabParallelEmbedding

# Checkpoint gate / up projections (dense layers and shared experts) into our fused gate_up_proj.
_FUSED = [(".gate_proj.", ".gate_up_proj.", 0), (".up_proj.", ".gate_up_proj.", 1)]


class DeepseekAttention(nn.Module):
    """MLA over the paged cache in its decompressed form (see the module docstring); this
    rank's heads under tensor parallelism (the latent projections are replicated)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, cache_idx: int) -> None:
        super().__init__()
        x = cfg.extra
        self.spec = cfg.attention_spec(layer_idx)
        self.layer_idx = cache_idx
        self.nope, self.rope = int(x["qk_nope_head_dim"]), int(x["qk_rope_head_dim"])
        self.v_dim, self.kv_rank = int(x["v_head_dim"]), int(x["kv_lora_rank"])
        self.qk_dim = self.nope + self.rope
        self.cache_dim = cfg.head_dim  # max(qk_dim, v_dim): K and V padded to it
        h, heads, bias = cfg.hidden_size, cfg.num_attention_heads, cfg.attention_bias
        q_rank = x["q_lora_rank"]
        self.q_proj = self.q_a_proj = self.q_a_layernorm = self.q_b_proj = None
        if q_rank is None:
            self.q_proj = ColumnParallelLinear(h, heads * self.qk_dim, bias=False)
            self.num_heads = self.q_proj.output_size_per_partition // self.qk_dim
        else:
            self.q_a_proj = ReplicatedLinear(h, int(q_rank), bias=bias)
            self.q_a_layernorm = RMSNorm(int(q_rank), 1e-6)  # transformers' default eps
            self.q_b_proj = ColumnParallelLinear(int(q_rank), heads * self.qk_dim, bias=False)
            self.num_heads = self.q_b_proj.output_size_per_partition // self.qk_dim
        self.kv_a_proj_with_mqa = ReplicatedLinear(h, self.kv_rank + self.rope, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_rank, 1e-6)
        self.kv_b_proj = ColumnParallelLinear(
            self.kv_rank, heads * (self.nope + self.v_dim), bias=False
        )
        self.o_proj = RowParallelLinear(heads * self.v_dim, h, bias=bias)

    def _query(self, x: torch.Tensor) -> torch.Tensor:
        if self.q_proj is not None:
            return self.q_proj(x)
        assert self.q_a_proj is not None and self.q_a_layernorm is not None
        assert self.q_b_proj is not None
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))

    def forward(self, x: torch.Tensor, rope: Rope, attn: AttentionBackend) -> torch.Tensor:
        t, n, d = x.shape[0], self.num_heads, self.cache_dim
        q = self._query(x).view(t, n, self.qk_dim)
        latent, k_rope = self.kv_a_proj_with_mqa(x).split([self.kv_rank, self.rope], dim=-1)
        k_rope = k_rope.view(t, 1, self.rope)  # one rotary key, shared by every head
        rope(q[..., self.nope :], k_rope)  # in place, the rope parts only
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(t, n, self.nope + self.v_dim)
        k = x.new_zeros(t, n, d)
        k[..., : self.nope] = kv[..., : self.nope]
        k[..., self.nope : self.qk_dim] = k_rope
        v = x.new_zeros(t, n, d)
        v[..., : self.v_dim] = kv[..., self.nope :]
        if d > self.qk_dim:  # a value wider than the key: the query padded alike
            q = F.pad(q, (0, d - self.qk_dim))
        out = attn.forward(self.layer_idx, q, k, v, self.spec)  # [T, n, d]
        return self.o_proj(out[..., : self.v_dim].reshape(t, n * self.v_dim))


class DeepseekRouter(nn.Module):
    """The router's float32 weight (transformers keeps it in float32 for any model dtype) and,
    for V3, the per-expert score correction bias."""

    def __init__(self, moe: MoEConfig, hidden_size: int) -> None:
        super().__init__()
        assert moe.routing is not None
        self.routing, self.top_k = moe.routing, moe.top_k
        f32 = torch.float32
        e = moe.num_experts
        self.weight = nn.Parameter(torch.empty(e, hidden_size, dtype=f32), requires_grad=False)
        self.e_score_correction_bias = (
            nn.Parameter(torch.empty(e, dtype=f32), requires_grad=False)
            if moe.routing.correction_bias
            else None
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x.float(), self.weight)
        return grouped_topk(logits, self.top_k, self.routing, self.e_score_correction_bias)


class DeepseekMoE(nn.Module):
    def __init__(self, cfg: ModelConfig, moe: MoEConfig) -> None:
        super().__init__()
        self.gate = DeepseekRouter(moe, cfg.hidden_size)
        self.experts = FusedMoE(moe, cfg.hidden_size, cfg.hidden_act)
        shared = moe.shared_expert_intermediate_size
        self.shared_experts = (
            GatedMLP(cfg.hidden_size, shared, cfg.hidden_act, bias=cfg.mlp_bias) if shared else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        out = self.experts.routed(x, weights, ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out


class DeepseekDecoderLayer(ResidualStreamLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, cache_idx: int) -> None:
        super().__init__()
        self.self_attn = DeepseekAttention(cfg, layer_idx, cache_idx)
        moe = cfg.moe
        self.mlp: nn.Module
        if moe is not None and moe.is_sparse(layer_idx):
            self.mlp = DeepseekMoE(cfg, moe)
        else:
            self.mlp = GatedMLP(
                cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act, bias=cfg.mlp_bias
            )
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DeepseekModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = first_stage_only(
            lambda: VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        )
        rope = int(cfg.extra["qk_rope_head_dim"])
        self.rotary = RotaryEmbedding(
            rope,
            cfg.max_position_embeddings,
            cfg.rope_theta,
            cfg.rope_scaling,
            rope,
            is_neox=not cfg.extra["rope_interleave"],
        )
        self.layers, self.start_layer, self.end_layer = stage_layers(
            cfg.num_hidden_layers, lambda i, cache_idx: DeepseekDecoderLayer(cfg, i, cache_idx)
        )
        self.norm = last_stage_only(lambda: RMSNorm(cfg.hidden_size, cfg.rms_norm_eps))


class DeepseekV2ForCausalLM(LlamaForCausalLM):
    """Also DeepseekV3ForCausalLM: Llama's forward over DeepSeek's layers; the checkpoint's
    experts are stacked into the FusedMoE parameters and its gate/up pairs fused."""

    fused_weights = _FUSED
    fused_parts = {".gate_up_proj.": 2}
    model_class = DeepseekModel

    def load_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        loaded_elsewhere: Optional[set[str]] = None,
    ) -> None:
        """As Mixtral's; V3 checkpoints' multi-token-prediction layers (numbered from
        num_hidden_layers on) are skipped, as transformers skips them (generation does not
        use them)."""
        experts: set[str] = set(loaded_elsewhere or ())
        n = self.config.num_hidden_layers

        def decoder_only() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                parts = name.split(".")
                if name.startswith("model.layers.") and int(parts[2]) >= n:
                    continue
                yield name, tensor

        super().load_weights(split_expert_weights(self, decoder_only(), experts), experts)
