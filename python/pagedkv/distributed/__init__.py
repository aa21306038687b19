"""Tensor and pipeline parallelism on torch.distributed (NCCL on GPUs, gloo on CPUs).

parallel_state: the process groups (world, tensor-parallel, pipeline-parallel) of this process
and its ranks in them; at TP = PP = 1 every group is a one-rank local group and no process group
exists. communication: the collectives the model layers call (all-reduce, all-gather) on the
tensor-parallel group, which return their input unchanged on one rank.
"""

from __future__ import annotations

from pagedkv.distributed.communication import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from pagedkv.distributed.parallel_state import (
    GroupCoordinator,
    abort_communicators,
    abort_model_parallel,
    destroy_model_parallel,
    get_pp_group,
    get_tp_group,
    get_world_group,
    heads_per_rank,
    init_distributed_environment,
    initialize_model_parallel,
    model_parallel_is_initialized,
    pp_layer_range,
)

__all__ = [
    "GroupCoordinator",
    "abort_communicators",
    "abort_model_parallel",
    "destroy_model_parallel",
    "get_pp_group",
    "get_tp_group",
    "get_world_group",
    "heads_per_rank",
    "init_distributed_environment",
    "initialize_model_parallel",
    "model_parallel_is_initialized",
    "pp_layer_range",
    "tensor_model_parallel_all_gather",
    "tensor_model_parallel_all_reduce",
]
