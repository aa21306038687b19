"""Tensor-parallel linear layers (Megatron's split, as vLLM names them).

ColumnParallelLinear splits the output features over the tensor-parallel ranks (each rank
computes its slice; no communication); RowParallelLinear splits the input features and sums the
ranks' partial products with one all-reduce. A column-parallel layer feeding a row-parallel one
(QKV -> attention -> O, gate/up -> act -> down) costs one all-reduce per block.
QKVParallelLinear and MergedColumnParallelLinear are column-parallel layers fused from several
checkpoint tensors (q/k/v, gate/up): each rank holds its slice of every part, side by side.

Every parameter carries ``weight_loader(param, loaded, shard_id=None)``, which copies this
rank's slice of a full checkpoint tensor (``shard_id`` names the part of a fused layer), so a
rank only ever keeps its own shard. With one rank these are plain local layers.

Parameters start uninitialised: every one is overwritten by the checkpoint.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from pagedkv.distributed import get_tp_group, heads_per_rank

ShardId = Union[int, str, None]
WeightLoader = Callable[..., None]


def _param(*shape: int, loader: WeightLoader) -> nn.Parameter:
    """An uninitialised parameter that ``loader`` fills from the checkpoint."""
    param = nn.Parameter(torch.empty(*shape), requires_grad=False)
    param.weight_loader = loader  # type: ignore[attr-defined]
    return param


def check_not_fused(shard_id: ShardId) -> None:
    """The loader of a parameter that is not fused refuses a part of a fused tensor."""
    if shard_id is not None:
        raise ValueError(
            f"is a part ({shard_id!r}) of a fused tensor, but the parameter is not fused"
        )


def copy_checked(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst <- src (cast to dst's dtype); ValueError naming both shapes when they differ."""
    if tuple(dst.shape) != tuple(src.shape):
        raise ValueError(f"has shape {tuple(src.shape)}, expected {tuple(dst.shape)}")
    with torch.no_grad():
        dst.copy_(src.to(dst.dtype))


def default_weight_loader(
    param: torch.Tensor, loaded: torch.Tensor, shard_id: ShardId = None
) -> None:
    """A replicated parameter: the whole checkpoint tensor, on every rank."""
    check_not_fused(shard_id)
    copy_checked(param.data, loaded)


def _split(full: int, what: str) -> int:
    tp = get_tp_group().world_size
    if full % tp:
        raise ValueError(f"{what} ({full}) is not divisible by tensor_parallel_size {tp}")
    return full // tp


def _rank_slice(loaded: torch.Tensor, dim: int, size: int, index: int) -> torch.Tensor:
    """Slice ``index`` of ``size`` elements along ``dim``; a clear error when the checkpoint's
    tensor is not ``tp`` such slices long (it would otherwise narrow out of range)."""
    if loaded.shape[dim] < (index + 1) * size:
        raise ValueError(
            f"has shape {tuple(loaded.shape)}: dimension {dim} is too short for "
            f"slice {index} of {size}"
        )
    return loaded.narrow(dim, index * size, size)


class ColumnParallelLinear(nn.Module):
    """y = x A^T + b with A's rows (output features) split over the ranks. ``gather_output``
    all-gathers the full output on every rank; otherwise each rank keeps its slice."""

    def __init__(
        self, input_size: int, output_size: int, bias: bool = True, gather_output: bool = False
    ) -> None:
        super().__init__()
        self.input_size, self.output_size = input_size, output_size
        self.output_size_per_partition = _split(output_size, "output size")
        self.gather_output = gather_output
        self.tp_rank = get_tp_group().rank_in_group
        self.weight = _param(self.output_size_per_partition, input_size, loader=self.weight_loader)
        self.bias = (
            _param(self.output_size_per_partition, loader=self.weight_loader) if bias else None
        )

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId = None
    ) -> None:
        check_not_fused(shard_id)
        size = param.shape[0]
        if loaded.shape[0] != size * get_tp_group().world_size:
            raise ValueError(
                f"has shape {tuple(loaded.shape)}, expected "
                f"{(size * get_tp_group().world_size,) + tuple(param.shape[1:])}"
            )
        copy_checked(param.data, _rank_slice(loaded, 0, size, self.tp_rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        return get_tp_group().all_gather(y, -1) if self.gather_output else y


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs fused into one matmul (gate/up): each rank holds its
    slice of part 0, then its slice of part 1, ... Loaded part by part (shard_id = index)."""

    def __init__(
        self,
        input_size: int,
        output_sizes: List[int],
        bias: bool = True,
        gather_output: bool = False,
    ) -> None:
        self.output_sizes = list(output_sizes)
        for s in self.output_sizes:
            _split(s, "every fused output size")
        super().__init__(input_size, sum(output_sizes), bias, gather_output)

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId = None
    ) -> None:
        tp = get_tp_group().world_size
        if shard_id is None:  # the fused tensor as a whole: load it part by part
            offset = 0
            for i, size in enumerate(self.output_sizes):
                self.weight_loader(param, loaded.narrow(0, offset, size), i)
                offset += size
            return
        idx = int(shard_id)
        local = self.output_sizes[idx] // tp
        start = sum(self.output_sizes[:idx]) // tp
        if loaded.shape[0] != self.output_sizes[idx]:
            raise ValueError(
                f"has shape {tuple(loaded.shape)}, expected "
                f"{(self.output_sizes[idx],) + tuple(param.shape[1:])}"
            )
        copy_checked(
            param.data.narrow(0, start, local), _rank_slice(loaded, 0, local, self.tp_rank)
        )


class QKVParallelLinear(ColumnParallelLinear):
    """The q, k and v projections in one column-parallel matmul, split by heads: rank r holds
    query heads [r*Hq/tp, (r+1)*Hq/tp) and its KV heads. With fewer KV heads than ranks, each KV
    head is replicated on tp/Hkv consecutive ranks (the ranks whose query heads use it).
    Parts: shard_id 0/"q", 1/"k", 2/"v"."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        total_num_heads: int,
        total_num_kv_heads: Optional[int] = None,
        bias: bool = True,
    ) -> None:
        tp = get_tp_group().world_size
        kv = total_num_kv_heads or total_num_heads
        self.head_dim = head_dim
        self.total_num_heads, self.total_num_kv_heads = total_num_heads, kv
        self.num_heads, self.num_kv_heads = heads_per_rank(total_num_heads, kv)
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim
        # Build as a column-parallel layer of this rank's size (the replicated KV heads make the
        # total larger than the checkpoint's when kv < tp).
        super().__init__(hidden_size, (self.q_size + 2 * self.kv_size) * tp, bias)

    def _kv_head_start(self) -> int:
        tp = get_tp_group().world_size
        if self.total_num_kv_heads >= tp:
            return self.tp_rank * self.num_kv_heads
        return self.tp_rank // (tp // self.total_num_kv_heads)

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId = None
    ) -> None:
        d = self.head_dim
        if shard_id is None:  # a fused q/k/v tensor (e.g. OPT-style GGUF): part by part
            q, kv = self.total_num_heads * d, self.total_num_kv_heads * d
            for i, (start, size) in enumerate(((0, q), (q, kv), (q + kv, kv))):
                self.weight_loader(param, loaded.narrow(0, start, size), i)
            return
        idx: Any = (
            {"q": 0, "k": 1, "v": 2}.get(shard_id, shard_id)
            if isinstance(shard_id, str)
            else int(shard_id)
        )
        if idx == 0:
            full, offset, size, head = (
                self.total_num_heads * d,
                0,
                self.q_size,
                self.tp_rank * self.num_heads,
            )
        else:
            full = self.total_num_kv_heads * d
            offset = self.q_size + (idx - 1) * self.kv_size
            size, head = self.kv_size, self._kv_head_start()
        if loaded.shape[0] != full:
            raise ValueError(
                f"has shape {tuple(loaded.shape)}, expected {(full,) + tuple(param.shape[1:])}"
            )
        copy_checked(param.data.narrow(0, offset, size), loaded.narrow(0, head * d, size))


class RowParallelLinear(nn.Module):
    """y = x A^T + b with A's columns (input features) split over the ranks: each rank
    multiplies its slice of x (the output of a column-parallel layer) and one all-reduce sums
    the partial products; the bias is added once, after the sum."""

    def __init__(
        self, input_size: int, output_size: int, bias: bool = True, reduce_results: bool = True
    ) -> None:
        super().__init__()
        self.input_size, self.output_size = input_size, output_size
        self.input_size_per_partition = _split(input_size, "input size")
        self.reduce_results = reduce_results
        self.tp_rank = get_tp_group().rank_in_group
        self.weight = _param(output_size, self.input_size_per_partition, loader=self.weight_loader)
        # Added once, after the sum: every rank holds the whole bias.
        self.bias = _param(output_size, loader=default_weight_loader) if bias else None

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId = None
    ) -> None:
        check_not_fused(shard_id)
        size = param.shape[1]
        expected = (param.shape[0], size * get_tp_group().world_size)
        if tuple(loaded.shape) != expected:
            raise ValueError(f"has shape {tuple(loaded.shape)}, expected {expected}")
        copy_checked(param.data, _rank_slice(loaded, 1, size, self.tp_rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tp = get_tp_group()
        if tp.world_size == 1:
            return F.linear(x, self.weight, self.bias)
        y = F.linear(x, self.weight)
        if self.reduce_results:
            tp.all_reduce(y)
        return y if self.bias is None else y + self.bias


class ReplicatedLinear(nn.Module):
    """A linear layer every rank holds whole (small projections not worth splitting)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = True) -> None:
        super().__init__()
        self.weight = _param(output_size, input_size, loader=default_weight_loader)
        self.bias = _param(output_size, loader=default_weight_loader) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)
