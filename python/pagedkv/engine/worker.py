"""Worker: one rank of a tensor/pipeline-parallel engine (its model shard, KV cache, steps).

Every rank, the driver's included, runs the same Worker methods in the same order: the driver
calls them directly, the other ranks when the driver's command arrives (worker_loop). So the
collectives inside (the model's all-reduces, the KV-block minimum, the stages' send/recv, the
logits' all-gather) always meet their partners. The scheduler, sampler and tokenizer exist on
the driver only.

A step on rank r of stage s: receive the previous stage's hidden states (s > 0), run the
stage's layers over its heads' slice of the KV cache, send the result on (s < last); the last
stage keeps its final hidden states until the driver asks for the logits of some rows, which
the last stage's LM head computes (vocab-parallel, all-gathered) and its first rank sends to the
driver (global rank 0) when the driver is not on that stage.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Optional, Tuple, Union

import numpy as np
import torch

from pagedkv.distributed import get_pp_group, get_tp_group, get_world_group
from pagedkv.distributed.shm_ring import PeerGone
from pagedkv.engine.config import EngineConfig
from pagedkv.engine.micro_batches import split_plan
from pagedkv.engine.model_runner import ModelRunner

logger = logging.getLogger("pagedkv")

# The driver's command that ends worker_loop.
SHUTDOWN = "shutdown"


class Worker:
    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        from pagedkv.engine.engine_setup import check_servable
        from pagedkv.models import load_model

        self.cfg, self.device = cfg, device
        self.model, self.model_config = load_model(
            cfg.model, cfg.dtype, device, **cfg.model_load_kwargs(), check=check_servable
        )
        self.dtype = next(self.model.parameters()).dtype
        _check_parallel_support(self.model, self.model_config.architecture)
        tp = get_tp_group()
        if cfg.tp_all_reduce == "one_shot" and tp.world_size > 1:
            from pagedkv.distributed.one_shot_all_reduce import (
                DEFAULT_MAX_BYTES,
                OneShotAllReduce,
            )

            # (Every rank builds its Worker at this point: the buffers' exchange meets.)
            tp.one_shot = OneShotAllReduce(tp.device_group, self.dtype, device, DEFAULT_MAX_BYTES)
        self.runner: Optional[ModelRunner] = None
        self._hidden: Optional[torch.Tensor] = None  # the last stage's latest hidden states
        self.micro_batched_steps = 0  # steps run as pipeline micro-batches

    # ------------------------------------------------------------------ set-up
    def make_runner(self, max_model_len: int, max_num_batched_tokens: int) -> None:
        self.runner = ModelRunner(
            self.cfg,
            self.model,
            self.model_config,
            self.device,
            self.dtype,
            max_model_len,
            max_num_batched_tokens,
        )

    def determine_num_blocks(self) -> Tuple[int, int]:
        """The blocks every rank can hold: each rank sizes its own slice, the minimum wins (the
        one scheduler hands out block ids valid on all ranks)."""
        num, num_cpu = self._runner.determine_num_blocks()
        world = get_world_group()
        return world.all_reduce_min(num), world.all_reduce_min(num_cpu)

    def allocate_kv_cache(
        self, num_blocks: int, num_cpu_blocks: int, max_model_len: int, max_num_batched_tokens: int
    ) -> None:
        runner = self._runner
        runner.max_model_len, runner.max_num_batched_tokens = max_model_len, max_num_batched_tokens
        runner.allocate_kv_cache(num_blocks, num_cpu_blocks)

    def capture_cuda_graphs(self, max_num_seqs: int) -> None:
        self._runner.capture_cuda_graphs(max_num_seqs)

    def release_cuda_graphs(self) -> None:
        """Before this rank's process groups go (ModelRunner.release_cuda_graphs)."""
        if self.runner is not None:
            self.runner.release_cuda_graphs()

    def min_graph_replays(self) -> int:
        """The fewest decode steps any rank ran as CUDA-graph replays (0 without graphs): a
        rank that ran a step eagerly while the others replayed would show here."""
        graphs = self._runner.graphs
        return get_world_group().all_reduce_min(graphs.num_replays if graphs is not None else 0)

    @property
    def _runner(self) -> ModelRunner:
        if self.runner is None:
            raise RuntimeError("make_runner() must come first")
        return self.runner

    # ------------------------------------------------------------------ one step
    def apply_block_ops(self, plan: Any) -> None:
        self._runner.apply_block_ops(plan)

    def finish_swap_out(self, plan: Any) -> None:
        self._runner.finish_swap_out(plan)

    def execute(
        self,
        plan: Any,
        prev_tokens: Union[None, int, torch.Tensor] = None,
        logits: bool = False,
    ) -> Optional[torch.Tensor]:
        """The stage's forward; the final hidden states on the last stage, else None. Under
        pipeline parallelism a large step runs as micro-batches (micro_batches.py): this stage
        sends micro-batch j on and starts j+1 while the next stage runs j.

        ``prev_tokens`` (overlapped scheduling: the plan's input ids hold placeholders for the
        previous step's tokens, see ModelRunner.execute): the driver's device tensor of them
        on the driver, their count on the other ranks; the first stage's ranks receive them
        from the driver in a broadcast over their tensor-parallel group (on the device stream:
        no host waits for the previous step). ``logits`` (a worker, no pipeline stages): go on
        to compute_logits of all rows, the driver's next call (executor_mp says when), without
        waiting for its command."""
        prev = _prev_tokens(prev_tokens, self.device)
        pp = get_pp_group()
        if pp.world_size == 1:
            self._hidden = self._runner.execute(plan, None, prev_tokens=prev)
            if logits:
                self.compute_logits(None, int(plan.num_tokens), False)
            return self._hidden
        parts = split_plan(plan, pp.world_size, self.cfg.pipeline_micro_batch_tokens)
        self.micro_batched_steps += len(parts) > 1
        outs, sends = [], []
        for part in parts:
            inter = None
            if not pp.is_first_rank:
                shape = (int(part.num_tokens), self.model_config.hidden_size)
                inter = pp.recv(shape, self.dtype, pp.rank_in_group - 1)
            out = self._runner.execute(part, inter, prev_tokens=prev)
            if len(parts) > 1:
                # A captured graph's output is padded, and its buffer is the next replay's.
                out = out[: int(part.num_tokens)].clone()
            if pp.is_last_rank:
                outs.append(out)
            else:
                sends.append((pp.isend(out, pp.rank_in_group + 1), out))
        for work, _ in sends:
            work.wait()
        if not pp.is_last_rank:
            return None
        self._hidden = outs[0] if len(outs) == 1 else torch.cat(outs)
        return self._hidden

    def compute_logits(
        self, rows: Union[None, np.ndarray, int, torch.Tensor], num_rows: int, upcast: bool
    ) -> Optional[torch.Tensor]:
        """Logits [num_rows, vocab] of the last step's hidden ``rows`` (all when None), on the
        driver; None on the other ranks. ``rows`` may also be the driver's device tensor of
        them (on the driver; their count on the other ranks), broadcast over the world group."""
        pp, world = get_pp_group(), get_world_group()
        if isinstance(rows, torch.Tensor):
            rows = world.broadcast(rows.to(torch.int64).contiguous(), 0)
        elif isinstance(rows, int):
            rows = world.broadcast(torch.empty(rows, dtype=torch.int64, device=self.device), 0)
        last_first = world.world_size - get_tp_group().world_size  # the last stage's rank 0
        dtype = torch.float32 if upcast else self.dtype
        if not pp.is_last_rank:
            if world.rank != 0:
                return None
            out = torch.empty(
                num_rows, self.model_config.vocab_size, dtype=dtype, device=self.device
            )
            torch.distributed.recv(out, src=last_first, group=world.device_group)
            return out
        assert self._hidden is not None, "compute_logits() before execute()"
        idx = torch.from_numpy(rows).to(self.device) if isinstance(rows, np.ndarray) else rows
        logits = self._runner.compute_logits(self._hidden, idx, upcast)
        if world.rank == last_first and world.rank != 0:
            torch.distributed.send(logits.contiguous(), dst=0, group=world.device_group)
        return logits


def _prev_tokens(
    prev: Union[None, int, torch.Tensor], device: torch.device
) -> Optional[torch.Tensor]:
    """The previous step's sampled tokens on this rank's device, where this rank's stage reads
    input ids (the first one); None elsewhere. The driver (global rank 0) is the first rank
    of the first stage's tensor-parallel group: it broadcasts them there."""
    if prev is None or not get_pp_group().is_first_rank:
        return None
    tp = get_tp_group()
    if isinstance(prev, torch.Tensor):
        return tp.broadcast(prev.to(torch.int64).contiguous(), 0)
    return tp.broadcast(torch.empty(prev, dtype=torch.int64, device=device), 0)


def _check_parallel_support(model: torch.nn.Module, architecture: str) -> None:
    """Refuses, by name, a model whose code cannot be split as asked (rather than computing a
    wrong or unsharded result)."""
    from pagedkv.models.linear import ColumnParallelLinear, RowParallelLinear

    if get_tp_group().world_size > 1 and not any(
        isinstance(m, (ColumnParallelLinear, RowParallelLinear)) for m in model.modules()
    ):
        raise ValueError(
            f"{architecture} does not support tensor parallelism (its layers are "
            "not tensor-parallel); use tensor_parallel_size=1"
        )
    if get_world_group().world_size > 1 and (
        hasattr(model, "encode_images") or hasattr(model, "mrope_positions")
    ):
        # The executor's commands carry no image rows or M-RoPE positions.
        raise ValueError(
            f"{architecture} (image inputs) does not support tensor or pipeline parallelism "
            "yet; use tensor_parallel_size=1 and pipeline_parallel_size=1"
        )
    if (
        get_pp_group().world_size > 1
        and "intermediate" not in inspect.signature(model.forward).parameters
    ):
        raise ValueError(
            f"{architecture} does not support pipeline parallelism; use pipeline_parallel_size=1"
        )


def worker_loop(worker: Worker, channel: Any) -> bool:
    """A non-driver rank: runs the driver's commands (from command_channel) until it says stop
    (True) or is gone (False)."""
    while True:
        try:
            name, args = channel.recv()
        except PeerGone:
            logger.error("the driver process is gone; this worker stops")
            return False
        if name == SHUTDOWN:
            return True
        getattr(worker, name)(*args)
