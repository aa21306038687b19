"""Phi-3 / Phi-3.5 / Phi-4-mini: Llama's layers with q/k/v and gate/up stored fused in the
checkpoint (``qkv_proj``, ``gate_up_proj``: our own layout, loaded as they are), LongRoPE
scaling, partial rotary (Phi-4-mini) and a sliding window on every layer where configured."""

from __future__ import annotations

from pagedkv.models.layers import FusedMapping
from pagedkv.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    fused_weights: FusedMapping = []
    fused_parts: dict[str, int] = {}
