"""The one interface between model code and whatever stores the KV cache."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class AttentionBackend(Protocol):
    """Attention for one model forward over a flat batch of ``T`` tokens.

    The engine sets the step metadata (query_start_loc, slot_mapping, block tables, ...) on the
    backend before calling ``model.forward``; the model only hands over each layer's projections
    after rotary embedding. The backend writes k/v into its cache, attends causally over each
    sequence's cached context plus its new tokens, and applies the softmax scale itself
    (``1/sqrt(head_dim)`` for every model here).
    """

    def forward(
        self,
        layer_idx: int,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        k: torch.Tensor,  # [T, num_kv_heads, head_dim]
        v: torch.Tensor,  # [T, num_kv_heads, head_dim]
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        ...
