"""Mixtral: the Llama decoder (GQA, rotary) with a sparse MoE block in place of every MLP;
top-k routing renormalised over the chosen experts (a softmax over their logits).

The MoE blocks come from models/moe.py through LlamaDecoderLayer (the config's ``moe``); what
is Mixtral's own is the checkpoint layout: ``block_sparse_moe.gate`` and per-expert
``block_sparse_moe.experts.{e}.w1 / w3 / w2`` (gate / up / down), stacked on loading.
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch import nn

from pagedkv.models.layers import check_all_loaded, load_weights_into
from pagedkv.models.llama import _FUSED, LlamaForCausalLM
from pagedkv.models.moe import split_expert_weights


def load_moe_checkpoint(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """HF-named tensors of a Llama-style MoE checkpoint (Mixtral, Qwen2/3-MoE) into ``model``:
    experts stacked per layer, q/k/v and gate/up fused as in Llama."""
    cfg = model.config
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim

    def shard_sizes(name: str) -> list[int]:
        if ".qkv_proj." in name:
            return [q, kv, kv]
        if ".shared_expert." in name:
            return [cfg.moe.shared_expert_intermediate_size] * 2
        return [cfg.intermediate_size] * 2

    def rename(name: str) -> Optional[str]:
        if "rotary_emb.inv_freq" in name:
            return None
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            return None  # some tied checkpoints store the shared matrix twice
        return name

    experts: set[str] = set()
    written = load_weights_into(model, split_expert_weights(model, weights, experts), _FUSED,
                                shard_sizes, rename)
    check_all_loaded(model, written | experts, {".qkv_proj.": 3, ".gate_up_proj.": 2})


class MixtralForCausalLM(LlamaForCausalLM):
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_moe_checkpoint(self, weights)
