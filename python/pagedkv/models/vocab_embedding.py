"""Vocabulary-parallel embedding and LM head (Megatron's split of the vocabulary rows).

The vocabulary is padded to a multiple of the tensor-parallel size and each rank holds one
contiguous range of rows. The embedding looks up the ids in its range, zeroes the others and
all-reduces (each id is found on exactly one rank); the LM head computes the logits of its range
and all-gathers them, the padding columns dropped. Tied embeddings share one parameter: both
layers split the vocabulary the same way. With one rank these are plain local layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedkv.distributed import get_tp_group
from pagedkv.models.linear import ShardId, check_not_fused, copy_checked, default_weight_loader


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        tp = get_tp_group()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.rows_per_partition = -(-num_embeddings // tp.world_size)
        self.vocab_start = tp.rank_in_group * self.rows_per_partition
        # Rows of the real vocabulary on this rank (the last rank may hold padding rows only).
        self.num_real_rows = max(0, min(self.rows_per_partition, num_embeddings - self.vocab_start))
        self.weight = nn.Parameter(
            torch.empty(self.rows_per_partition, embedding_dim), requires_grad=False
        )
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId = None
    ) -> None:
        check_not_fused(shard_id)
        expected = (self.num_embeddings, self.embedding_dim)
        if tuple(loaded.shape) != expected:
            raise ValueError(f"has shape {tuple(loaded.shape)}, expected {expected}")
        n = self.num_real_rows
        copy_checked(param.data[:n], loaded.narrow(0, self.vocab_start, n))
        with torch.no_grad():
            param.data[n:].zero_()  # padding rows: zero logits, never looked up

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        tp = get_tp_group()
        if tp.world_size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_real_rows)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside.unsqueeze(-1), 0)
        return tp.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """hidden [N, dim] -> logits [N, num_embeddings] on every rank of the group."""

    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(self.rows_per_partition), requires_grad=False)
            self.bias.weight_loader = self._bias_loader  # type: ignore[attr-defined]

    def _bias_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId = None
    ) -> None:
        if get_tp_group().world_size == 1:
            default_weight_loader(param, loaded, shard_id)
            return
        n = self.num_real_rows
        copy_checked(param.data[:n], loaded.narrow(0, self.vocab_start, n))
        with torch.no_grad():
            param.data[n:].zero_()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, self.weight, self.bias)
        tp = get_tp_group()
        if tp.world_size == 1:
            return logits
        return tp.all_gather(logits, -1)[..., : self.num_embeddings]
