"""CUDA graphs for decode steps (as vLLM does): one graph per padded batch size.

A decode step launches hundreds of small kernels; replaying a captured graph removes the
Python and launch overhead that dominates at small batch. Graphs read their inputs from static
buffers that each step refills; a batch is padded up to the next captured size with padding
tokens (slot -1: not written to the cache; seq_len 1: a one-key attention whose result is
dropped). The attention ops are graph-safe: no host sync, no allocation, fixed launch shapes for a
given bound on the sequence length (``max_seq_len_to_capture``, capped at max_model_len).

Capture runs with Python's garbage collector paused (after one full collection). A collection
during capture can run the destructor of an unreachable engine's CUDA graphs, and
cudaGraphExecDestroy is not permitted while a stream captures: it invalidates the capture in
progress ("operation not permitted when stream is capturing" from CUDAGraph::reset, then a
failed capture_end). For the same reason this runner holds no reference back to the
ModelRunner that owns it: a dropped engine is freed by reference counting, not left for the
collector. (The collection before capture also takes the start-up heap off the collector's
pending count, so a full collection, tens of ms, does not fall into the first steps.)

With ``cascade_cuda_graphs``, decode rows that share a cached prefix (StepPlans.fill_cascade: a
system prompt, parallel samples) replay a second graph per batch size, captured on the cascade
path (pagedkv.cascade: the shared blocks read once for all rows); its plans and block tables live
in fixed buffers the step refills, so any shared prefix replays it. Steps without one replay the
plain graph.

Under pipeline parallelism a stage after the first starts from the previous stage's hidden
states: its graphs read them from one more static buffer, refilled each step like the others.
Under tensor parallelism the graphs capture the layers' NCCL all-reduces (every rank captures
the same sizes in the same order, so the collectives meet).
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from pagedkv.cascade import CASCADE_MIN_SEQS
from pagedkv.engine.model_runner import fill_placeholders
from pagedkv.engine.paged_backend import AttentionMetadata, PagedAttentionBackend


def capture_sizes(max_num_seqs: int) -> List[int]:
    sizes = [1, 2, 4] + list(range(8, 513, 8))
    return [s for s in sizes if s <= max_num_seqs] or [1]


class CudaGraphRunner:
    def __init__(self, runner: Any, max_num_seqs: int) -> None:
        # What capture needs from the ModelRunner, copied out (no back-reference: see above).
        self.model = runner.model
        self.kv_caches = runner.kv_caches
        self.num_heads, self.num_kv_heads = runner.num_heads, runner.num_kv_heads  # this rank's
        self.head_dim, self.block_size = runner.head_dim, runner.block_size
        self.kv_cache_dtype = runner.kv_cache_dtype  # graphs capture the fp8 kernels too
        # The balanced decode's plans (refilled before each replay where the graphs use them).
        self.step_plans = runner.step_plans
        self.cascade = bool(runner.cfg.cascade_cuda_graphs)  # capture the cascade variant
        self.batch_sizes = capture_sizes(max_num_seqs)
        self.max_len = min(runner.max_model_len, runner.cfg.max_seq_len_to_capture)
        max_bs, dev = self.batch_sizes[-1], runner.device
        width = -(-self.max_len // self.block_size)
        # The graphs' static inputs live in two device buffers, each refilled by one copy per
        # step from a pinned host mirror (not one copy and one padding fill per field).
        self._host64, self._dev64 = _mirrored((3, max_bs), torch.int64, dev)
        self.input_ids, self.positions, self.slot_mapping = self._dev64.unbind(0)
        self._host64[2] = -1  # padding slots: not written to the cache
        self._host32, self._dev32 = _mirrored((max_bs * (1 + width),), torch.int32, dev)
        self.seq_lens = self._dev32[:max_bs]
        self.block_tables = self._dev32[max_bs:].view(max_bs, width)
        self._host32[:max_bs] = 1  # padding rows: a one-key attention whose result is dropped
        self._host32[max_bs:] = 0
        self._dev64.copy_(self._host64)
        self._dev32.copy_(self._host32)
        self._copied = torch.cuda.Event()  # the last host -> device copy of the mirrors
        self.query_start_loc = torch.zeros(1, dtype=torch.int32, device=dev)
        # A later pipeline stage's input: the previous stage's hidden states (else None).
        self.intermediate = (
            None
            if runner.is_first_stage
            else torch.zeros(max_bs, runner.mc.hidden_size, dtype=runner.dtype, device=dev)
        )
        # With LoRA enabled, a second graph per batch size runs the adapters' deltas, reading
        # each row's adapter slot (-1 = none) from one more mirrored buffer; steps without an
        # adapter keep the plain graphs (the LoRA kernels would only add launches there).
        lora = getattr(runner, "lora", None)
        self.lora_step = None if lora is None else lora.targets.step
        self.lora_graphs: Dict[int, Tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        if self.lora_step is not None:
            self._host_lora, self._dev_lora = _mirrored((max_bs,), torch.int32, dev)
            self._host_lora.fill_(-1)
            self._dev_lora.fill_(-1)
        self.graphs: Dict[int, Tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        # The cascade variant per batch size of at least CASCADE_MIN_SEQS rows (no LoRA).
        self.cascade_graphs: Dict[int, Tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.num_replays = 0  # decode steps served by a graph (tests and logs read it)
        self.cascade_replays = 0  # ... by a cascade graph
        self._capture_all()

    def _backend(self, bs: int) -> PagedAttentionBackend:
        backend = PagedAttentionBackend(
            self.kv_caches,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.block_size,
            self.kv_cache_dtype,
            self.step_plans,
        )
        backend.set_metadata(
            AttentionMetadata(
                num_prefills=0,
                num_prefill_tokens=0,
                num_decode_tokens=bs,
                slot_mapping=self.slot_mapping[:bs],
                seq_lens=self.seq_lens[:bs],
                query_start_loc=self.query_start_loc,
                block_tables=self.block_tables[:bs],
                max_query_len=1,
                max_decode_seq_len=self.max_len,
            )
        )
        return backend

    def _cascades(self, bs: int) -> bool:
        """Whether a batch of ``bs`` rows gets a cascade variant."""
        plans = self.step_plans
        return (
            self.cascade
            and plans is not None
            and plans.cascade is not None
            and bs >= CASCADE_MIN_SEQS
        )

    @torch.inference_mode()
    def _capture_all(self) -> None:
        model, pool = self.model, None
        with _gc_paused():
            # Largest first, so smaller graphs reuse the memory pool of the larger ones.
            for bs in reversed(self.batch_sizes):
                pool = self._capture(model, bs, pool, self.graphs)
                if self._cascades(bs):
                    pool = self._capture(model, bs, pool, self.cascade_graphs, cascade=True)
                if self.lora_step is not None:
                    try:
                        pool = self._capture(model, bs, pool, self.lora_graphs, lora=True)
                    finally:
                        self.lora_step.token_lora_indices = None
        if self.step_plans is not None:
            self.step_plans.begin_step(None)
        torch.cuda.synchronize()

    def _capture(
        self,
        model: Any,
        bs: int,
        pool: Any,
        into: Dict[int, Any],
        lora: bool = False,
        cascade: bool = False,
    ) -> Any:
        if self.step_plans is not None:  # the graph's fixed schedule (and cascade or not)
            self.step_plans.begin_capture(bs, cascade)
        backend = self._backend(bs)
        ids, pos = self.input_ids[:bs], self.positions[:bs]
        extra = [] if self.intermediate is None else [self.intermediate[:bs]]

        def forward() -> torch.Tensor:
            if lora:  # set anew per forward: the capture must hold the adapters' grouping too
                assert self.lora_step is not None
                self.lora_step.token_lora_indices = self._dev_lora[:bs]
            return model.forward(ids, pos, backend, *extra)

        forward()  # warm-up: lazy inits must not happen in capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = forward()
        into[bs] = (graph, out)
        return graph.pool()

    def can_run(self, num_seqs: int, max_seq_len: int, lora: bool = False) -> bool:
        return (
            num_seqs <= self.batch_sizes[-1]
            and max_seq_len <= self.max_len
            and (not lora or self.lora_step is not None)
        )

    def run(
        self,
        plan: Any,
        intermediate: Any = None,
        prev_tokens: Optional[torch.Tensor] = None,
        lora_slots: Optional[np.ndarray] = None,
        positions: Optional[np.ndarray] = None,
    ) -> torch.Tensor:
        """``intermediate``: the previous stage's hidden states [n, hidden] (later stages).
        ``prev_tokens`` fill in the placeholder input ids of an overlapped step (see
        ModelRunner.execute). ``lora_slots``: each row's adapter slot (-1 = none), or None for
        the plain graphs. ``positions``: the rows' rotary positions when not the plan's (an
        M-RoPE model's decodes, shifted by their request's delta)."""
        n = int(plan.num_seqs)
        bs = next(s for s in self.batch_sizes if s >= n)
        max_bs, width = self.block_tables.shape
        self._copied.synchronize()  # the previous step's copy has read the mirrors
        seq_lens, used = fill_graph_inputs(
            plan, bs, self._host64.numpy(), self._host32.numpy(), width, self.block_size, positions
        )
        self._dev64.copy_(self._host64, non_blocking=True)
        end = max_bs + n * width
        self._dev32[:end].copy_(self._host32[:end], non_blocking=True)
        if lora_slots is not None:
            hl = self._host_lora.numpy()
            hl[:n], hl[n:bs] = lora_slots[:n], -1
            self._dev_lora[:bs].copy_(self._host_lora[:bs], non_blocking=True)
        self._copied.record()
        if prev_tokens is not None:
            self.input_ids[:n].copy_(fill_placeholders(self.input_ids[:n], prev_tokens))
        if self.intermediate is not None:
            self.intermediate[:n].copy_(intermediate)  # padding rows keep finite old values
        graphs = self.graphs if lora_slots is None else self.lora_graphs
        if self.step_plans is not None:
            self.step_plans.fill_all(seq_lens, bs)  # padding rows: no items (zero output)
            if (
                lora_slots is None
                and bs in self.cascade_graphs
                and self.step_plans.fill_cascade(seq_lens, plan.block_tables[:n, :used], bs)
            ):
                graphs = self.cascade_graphs
                self.cascade_replays += 1
        graph, out = graphs[bs]
        graph.replay()
        self.num_replays += 1
        return out[:n]

    def release(self) -> None:
        """Destroys every graph now (ModelRunner.release_cuda_graphs says why)."""
        destroy_graphs(self.graphs, self.cascade_graphs, self.lora_graphs)


def destroy_graphs(*tables: Dict[int, Tuple[torch.cuda.CUDAGraph, torch.Tensor]]) -> None:
    """Destroys the graphs of each {batch size: (graph, output)} table and empties it."""
    for table in tables:
        for graph, _ in table.values():
            graph.reset()
        table.clear()


def fill_graph_inputs(
    plan: Any,
    bs: int,
    h64: np.ndarray,
    h32: np.ndarray,
    width: int,
    block_size: int,
    positions: Optional[np.ndarray] = None,
) -> Tuple[np.ndarray, int]:
    """Writes a decode plan's rows, padded to ``bs``, into the graphs' host mirrors: ``h64``
    [3, max_bs] (input ids, positions, slots), ``h32`` (seq lens [max_bs], then block tables
    [max_bs, width]). Returns (the plan's seq lens, the block-table columns in use). The host
    side of a replay, apart so benchmarks/host_step.py times it on machines without CUDA."""
    n, max_bs = int(plan.num_seqs), h64.shape[1]
    seq_lens = np.asarray(plan.seq_lens[:n])
    used = max(1, -(-int(seq_lens.max()) // block_size))
    h64[0, :n], h64[0, n:bs] = plan.input_ids[:n], 0
    h64[1, :n], h64[1, n:bs] = (plan.positions if positions is None else positions)[:n], 0
    h64[2, :n], h64[2, n:bs] = plan.slot_mapping[:n], -1
    h32[:n], h32[n:bs] = seq_lens, 1
    # Rows past n keep earlier block ids (valid ones): padding rows read one key only.
    h32[max_bs : max_bs + n * width].reshape(n, width)[:, :used] = plan.block_tables[:n, :used]
    return seq_lens, used


def _mirrored(
    shape: Tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> Tuple[torch.Tensor, torch.Tensor]:
    """A pinned host buffer and its device twin (asynchronous copies need pinned memory).

    Zeroed: the capture's warm-up forward reads them before any step has filled them, and
    recycled pinned memory (e.g. a dropped engine's) holds stale token ids and positions that
    index out of the embedding and rotary tables (a device-side assert seen on the H100)."""
    return (
        torch.zeros(shape, dtype=dtype, pin_memory=True),
        torch.empty(shape, dtype=dtype, device=device),
    )


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Collects now, then keeps automatic collection off until the block ends."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
