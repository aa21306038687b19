"""The collectives model layers call, on the tensor-parallel group (no-ops on one rank)."""

from __future__ import annotations

import torch

from pagedkv.distributed.parallel_state import get_tp_group


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over the tensor-parallel ranks (``x`` itself on one rank)."""
    return get_tp_group().all_reduce(x)


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The ranks' ``x`` concatenated along ``dim``, in rank order, on every rank."""
    return get_tp_group().all_gather(x, dim)
