"""Mixtral: the Llama decoder (GQA, rotary) with a sparse MoE block in place of every MLP;
top-k routing renormalised over the chosen experts (a softmax over their logits).

The MoE blocks come from models/moe.py through LlamaDecoderLayer (the config's ``moe``); what
is Mixtral's own is the checkpoint layout: ``block_sparse_moe.gate`` and per-expert
``block_sparse_moe.experts.{e}.w1 / w3 / w2`` (gate / up / down), stacked on loading.
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch

from pagedkv.models.llama import LlamaForCausalLM
from pagedkv.models.moe import split_expert_weights


class MixtralForCausalLM(LlamaForCausalLM):
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]],
                     loaded_elsewhere: Optional[set[str]] = None) -> None:
        """Per-expert tensors are stacked into the FusedMoE parameters; the rest loads as in
        Llama (``block_sparse_moe`` read as ``mlp``)."""
        experts: set[str] = set(loaded_elsewhere or ())
        super().load_weights(split_expert_weights(self, weights, experts), experts)
