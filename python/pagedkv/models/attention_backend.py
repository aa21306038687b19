"""The one interface between model code and whatever stores the KV cache."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class AttentionSpec:
    """How one layer attends, fixed by the model's config: every backend must honour all of it.

    scale: the softmax scale (1/sqrt(head_dim) for most models; Gemma's query_pre_attn_scalar).
    sliding_window: each query sees only the last ``sliding_window`` keys (itself included), as HF
    transformers masks them (``kv_idx > q_idx - sliding_window``); None: the whole context.
    logits_soft_cap: ``cap * tanh(logit / cap)`` on the scaled logits (Gemma 2); 0: none.
    causal: False for encoders (BERT): every token of a sequence sees all of its tokens, so the
    whole sequence must be in one forward (no chunked prefill, no decode, no sliding window).
    """

    scale: float
    sliding_window: Optional[int] = None
    logits_soft_cap: float = 0.0
    causal: bool = True

    @classmethod
    def default(cls, head_dim: int) -> AttentionSpec:
        return cls(scale=1.0 / math.sqrt(head_dim))

    def __post_init__(self) -> None:
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or None, got {self.sliding_window}")
        if self.logits_soft_cap < 0:
            raise ValueError(f"logits_soft_cap must be >= 0, got {self.logits_soft_cap}")
        if not self.causal and self.sliding_window is not None:
            raise ValueError("sliding_window needs causal attention (causal=False was given)")


@runtime_checkable
class AttentionBackend(Protocol):
    """Attention for one model forward over a flat batch of ``T`` tokens.

    The engine sets the step metadata (query_start_loc, slot_mapping, block tables, ...) on the
    backend before calling ``model.forward``; the model only hands over each layer's projections
    after rotary embedding, and the layer's AttentionSpec. The backend writes k/v into its cache
    and attends causally over each sequence's cached context plus its new tokens, as the spec
    says (scale, sliding window, soft cap; non-causal over the whole sequence for encoders).
    """

    def forward(
        self,
        layer_idx: int,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        k: torch.Tensor,  # [T, num_kv_heads, head_dim]
        v: torch.Tensor,  # [T, num_kv_heads, head_dim]
        spec: AttentionSpec,
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        ...
