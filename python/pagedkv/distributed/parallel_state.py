"""This process's place in the parallel layout: world, tensor-parallel and pipeline-parallel groups.

Ranks are laid out as Megatron / vLLM do: ``rank = pp_rank * tp_size + tp_rank``, so the ranks
of one pipeline stage are consecutive (one node's GPUs share a stage's all-reduces). Every group
has a device group (NCCL on CUDA, gloo on the CPU) for tensors on the model's device and a gloo
group for host-side values (the KV-block minimum; the driver's commands under torchrun).

Until initialize_model_parallel() runs, every group is a local one-rank group: model layers built
then are plain local layers and their collectives return the input unchanged, with no
torch.distributed process group at all (TP = PP = 1 needs none).
"""

from __future__ import annotations

import contextlib
import datetime
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist


@dataclass
class GroupCoordinator:
    """One process group as this rank sees it, with the collectives the engine uses."""

    ranks: List[int]  # global ranks of the group, in group order
    rank: int  # this process's global rank
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    device_group: Any = None  # ProcessGroup for device tensors (None: one rank)
    cpu_group: Any = None  # gloo ProcessGroup for host objects (None: one rank)
    # A faster all-reduce for the messages it takes (one_shot_all_reduce.py), else None.
    one_shot: Any = None

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def rank_in_group(self) -> int:
        return self.ranks.index(self.rank)

    @property
    def is_first_rank(self) -> bool:
        return self.rank_in_group == 0

    @property
    def is_last_rank(self) -> bool:
        return self.rank_in_group == self.world_size - 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the group, in place; returns ``x``."""
        if self.world_size > 1:
            if self.one_shot is not None and self.one_shot.can_reduce(x):
                return self.one_shot(x)
            dist.all_reduce(x, group=self.device_group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """The ranks' ``x`` (same shape everywhere) concatenated along ``dim`` in rank order."""
        if self.world_size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x, group=self.device_group)
        return torch.cat(parts, dim=dim)

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """The group's rank ``src``'s ``x`` into ``x`` on every rank (in place); returns ``x``."""
        if self.world_size > 1:
            dist.broadcast(x, src=self.ranks[src], group=self.device_group)
        return x

    def all_reduce_min(self, value: int) -> int:
        """The smallest of the ranks' host integers (e.g. the KV blocks each rank can hold)."""
        if self.world_size == 1:
            return int(value)
        t = torch.tensor([int(value)], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return int(t.item())

    def send(self, x: torch.Tensor, dst: int) -> None:
        """Sends ``x`` to the group's rank ``dst`` (the receiver knows shape and dtype)."""
        dist.send(x.contiguous(), dst=self.ranks[dst], group=self.device_group)

    def isend(self, x: torch.Tensor, dst: int) -> Any:
        """Starts sending ``x`` to the group's rank ``dst``; returns the work to wait() on
        (``x`` must stay unchanged until then)."""
        return dist.isend(x.contiguous(), dst=self.ranks[dst], group=self.device_group)

    def recv(self, shape: Sequence[int], dtype: torch.dtype, src: int) -> torch.Tensor:
        out = torch.empty(tuple(shape), dtype=dtype, device=self.device)
        dist.recv(out, src=self.ranks[src], group=self.device_group)
        return out

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        """``obj`` of the group's rank ``src`` on every rank (pickled, over the gloo group)."""
        if self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=self.ranks[src], group=self.cpu_group)
        return box[0]


def _local_group() -> GroupCoordinator:
    return GroupCoordinator(ranks=[0], rank=0)


_WORLD: GroupCoordinator = _local_group()
_TP: GroupCoordinator = _local_group()
_PP: GroupCoordinator = _local_group()
_INITIALIZED = False
_IDLE_TIMEOUT = datetime.timedelta(days=365)


def get_world_group() -> GroupCoordinator:
    return _WORLD


def get_tp_group() -> GroupCoordinator:
    return _TP


def get_pp_group() -> GroupCoordinator:
    return _PP


def model_parallel_is_initialized() -> bool:
    return _INITIALIZED


def init_distributed_environment(
    world_size: int,
    rank: int,
    backend: str,
    init_method: Optional[str] = "env://",
    timeout_s: float = 300.0,
    store: Any = None,
) -> None:
    """Joins the default process group (rendezvous at ``init_method``, or through ``store``).
    ``timeout_s`` bounds every collective on the device groups: a peer that died
    mid-collective ends the step with an error, not a hang."""
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            init_method=None if store else init_method,
            store=store,
            world_size=world_size,
            rank=rank,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    elif dist.get_world_size() != world_size:
        raise RuntimeError(
            f"torch.distributed is already initialised with world size "
            f"{dist.get_world_size()}, not {world_size}"
        )


def initialize_model_parallel(
    tensor_parallel_size: int, pipeline_parallel_size: int, device: torch.device
) -> None:
    """Builds the TP and PP groups over the initialised world (every rank calls this, with the
    same sizes: torch.distributed requires all ranks to create all groups in the same order)."""
    global _WORLD, _TP, _PP, _INITIALIZED
    world, rank = dist.get_world_size(), dist.get_rank()
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    if tp * pp != world:
        raise ValueError(
            f"tensor_parallel_size {tp} x pipeline_parallel_size {pp} = {tp * pp} "
            f"ranks, but the world has {world}"
        )
    backend = dist.get_backend()
    # The world's host group carries the driver's commands, which idle workers wait for as
    # long as the engine is idle: no timeout worth the name (a dead driver closes the sockets).
    control = dist.new_group(backend="gloo", timeout=_IDLE_TIMEOUT)
    _WORLD = GroupCoordinator(list(range(world)), rank, device, dist.group.WORLD, control)
    tp_groups = [[p * tp + t for t in range(tp)] for p in range(pp)]
    pp_groups = [[p * tp + t for p in range(pp)] for t in range(tp)]
    _TP = _make_group(tp_groups, rank, device, backend)
    _PP = _make_group(pp_groups, rank, device, backend)
    _INITIALIZED = True


def _make_group(
    all_ranks: List[List[int]], rank: int, device: torch.device, backend: str
) -> GroupCoordinator:
    mine: Optional[GroupCoordinator] = None
    for ranks in all_ranks:
        device_group = dist.new_group(ranks, backend=backend)
        cpu_group = device_group if backend == "gloo" else dist.new_group(ranks, backend="gloo")
        if rank in ranks:
            mine = GroupCoordinator(ranks, rank, device, device_group, cpu_group)
    assert mine is not None
    return mine


def destroy_model_parallel() -> None:
    """Back to local one-rank groups; destroys the process groups (safe to call twice)."""
    global _WORLD, _TP, _PP, _INITIALIZED
    _WORLD, _TP, _PP = _local_group(), _local_group(), _local_group()
    _INITIALIZED = False
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def heads_per_rank(num_heads: int, num_kv_heads: int) -> Tuple[int, int]:
    """(query heads, KV heads) on each tensor-parallel rank: the heads split evenly; with fewer
    KV heads than ranks, each rank holds one KV head (replicated over tp / num_kv_heads ranks)."""
    tp = get_tp_group().world_size
    if num_heads % tp:
        raise ValueError(
            f"the number of attention heads ({num_heads}) is not divisible by "
            f"tensor_parallel_size {tp}"
        )
    if num_kv_heads >= tp:
        if num_kv_heads % tp:
            raise ValueError(
                f"the number of key/value heads ({num_kv_heads}) is not divisible "
                f"by tensor_parallel_size {tp}"
            )
        return num_heads // tp, num_kv_heads // tp
    if tp % num_kv_heads:
        raise ValueError(
            f"tensor_parallel_size {tp} is not a multiple of the number of "
            f"key/value heads ({num_kv_heads}): they cannot be replicated evenly"
        )
    return num_heads // tp, 1


def abort_communicators() -> None:
    """Makes a collective that waits on a dead peer fail now; any thread may call this.

    NCCL needs its communicators aborted (ncclCommAbort is made to be called from another
    thread); gloo needs nothing, since a dead peer's sockets close and its pending collective
    raises. Nothing else is touched: tearing the groups down from another thread while the
    stepping thread is inside a collective on them is a use-after-free (a killed-worker test
    crashed CI that way). The stepping thread destroys them (abort_model_parallel) once its
    collective has failed."""
    seen = set()
    for coord in (_WORLD, _TP, _PP):
        group = coord.device_group
        if group is None or id(group) in seen:
            continue
        seen.add(id(group))
        with contextlib.suppress(Exception):  # a group already torn down: nothing to abort
            if dist.get_backend(group) == "nccl":
                group.abort()


def abort_model_parallel() -> None:
    """Back to local groups after a failure: aborts and destroys the process groups. Only the
    thread that runs the steps may call this (see abort_communicators)."""
    global _WORLD, _TP, _PP, _INITIALIZED
    _WORLD, _TP, _PP = _local_group(), _local_group(), _local_group()
    _INITIALIZED = False
    if not (dist.is_available() and dist.is_initialized()):
        return
    # Either may fail on a group already torn down (or an older torch): nothing left to do.
    with contextlib.suppress(Exception):
        dist.distributed_c10d._abort_process_group()
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def pp_layer_range(num_layers: int) -> Tuple[int, int]:
    """[start, end) of the decoder layers on this pipeline stage: contiguous ranges, the first
    ``num_layers % pp`` stages taking one layer more."""
    pp = get_pp_group()
    size, rank = pp.world_size, pp.rank_in_group
    if num_layers < size:
        raise ValueError(
            f"pipeline_parallel_size {size} is larger than the model's {num_layers} layers"
        )
    base, extra = divmod(num_layers, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)
