"""Qwen3-MoE and Qwen2-MoE: the Llama decoder with sparse MoE blocks (models/moe.py) on the
layers the config makes sparse (``decoder_sparse_step``, ``mlp_only_layers`` stay dense with
``intermediate_size``), each expert of ``moe_intermediate_size``; top-k weights renormalised
only with ``norm_topk_prob``. Qwen3-MoE adds q/k RMSNorm to the attention; Qwen2-MoE has q/k/v
biases and a shared expert gated by sigmoid(shared_expert_gate(x)).
"""

from __future__ import annotations

from pagedkv.models.config import ModelConfig
from pagedkv.models.mixtral import MixtralForCausalLM


class Qwen2MoeForCausalLM(MixtralForCausalLM):
    """Loads like Mixtral (experts stacked per layer); the shared expert is a gated MLP."""


class Qwen3MoeForCausalLM(Qwen2MoeForCausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        # The attention's q/k RMSNorm comes with Qwen3 (ModelConfig.qk_norm); without it the
        # model would run and give wrong answers, so it is refused.
        if not getattr(cfg, "qk_norm", False):
            raise ValueError("Qwen3MoeForCausalLM needs the attention's q/k RMSNorm "
                             "(ModelConfig.qk_norm), which this build of pagedkv lacks")
        super().__init__(cfg)
