"""The engine's decode plans per step: the work-balanced plans (pagedkv.balanced_decode) and the
cascade over a shared prefix (pagedkv.cascade), decided once per step from the decode rows'
host lengths and block tables, used by every layer (PagedAttentionBackend._decode).

The cascade runs on eager steps and in CUDA graphs alike: its plans and block tables live in
fixed buffers that each step refills on the host (one copy each), so a graph captured on the
cascade path replays it for any shared prefix; the graph runner keeps that variant beside the
plain one and picks per step (CudaGraphRunner.run; EngineConfig.cascade_cuda_graphs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from pagedkv.balanced_decode import BalancedDecode, check_schedule, prefers_balanced
from pagedkv.cascade import CascadeDecode, shared_prefix_blocks


class CascadeTables:
    """The cascade's block tables in fixed buffers (a CUDA graph reads fixed addresses): the
    shared prefix's blocks [1, max_blocks], each row's own blocks [max_seqs, max_blocks] and own
    lengths [max_seqs]; ``fill`` writes them on the host from a step's tables and queues one
    copy to the device."""

    def __init__(self, max_seqs: int, max_blocks: int, block_size: int, device: Any) -> None:
        self.max_seqs, self.max_blocks, self.block_size = max_seqs, max(1, max_blocks), block_size
        w = self.max_blocks
        pin = torch.device(device).type == "cuda"
        # [prefix table (w) | own lengths (max_seqs) | own tables (max_seqs x w)]: the own
        # tables last, so a fill for fewer rows copies only the leading part.
        self._host = torch.zeros(w + max_seqs * (1 + w), dtype=torch.int32, pin_memory=pin)
        self._dev = self._host.to(device)
        self._copied = torch.cuda.Event() if pin else None
        self.prefix_table = self._dev[:w].view(1, w)
        self.own_lens = self._dev[w : w + max_seqs]
        self.own_tables = self._dev[w + max_seqs :].view(max_seqs, w)

    def fill(self, shared: int, own_lens: np.ndarray, tables: Any, rows: int) -> None:
        """``shared`` leading blocks of ``tables`` [n, >= blocks used] (host) are the prefix;
        ``own_lens`` [n] the keys after it. Rows n .. rows - 1 (a graph's padding) get none."""
        n, w = own_lens.shape[0], self.max_blocks
        own_blocks = -(-int(own_lens.max()) // self.block_size) if n else 0
        if shared + own_blocks > w or not n <= rows <= self.max_seqs:
            raise ValueError(
                f"a cascade of {n} sequences in {rows} rows over {shared} + {own_blocks} blocks "
                f"does not fit the tables made for {self.max_seqs} rows of {w} blocks"
            )
        if self._copied is not None:
            self._copied.synchronize()  # the previous copy has read the pinned buffer
        tables = np.asarray(tables)
        h = self._host.numpy()
        h[:shared] = tables[0, :shared]
        h[w : w + n] = own_lens
        h[w + n : w + rows] = 0
        own = h[w + self.max_seqs :].reshape(self.max_seqs, w)
        own[:n, :own_blocks] = tables[:n, shared : shared + own_blocks]
        end = w + self.max_seqs + rows * w
        self._dev[:end].copy_(self._host[:end], non_blocking=self._copied is not None)
        if self._copied is not None:
            self._copied.record()


@dataclass
class CascadeStep:
    """What a layer's cascade decode reads this step (PagedAttentionBackend._cascade)."""

    cascade: CascadeDecode
    prefix_table: torch.Tensor  # [1, max_blocks]
    own_tables: torch.Tensor  # [rows, max_blocks]
    own_lens: torch.Tensor  # [rows]
    max_own_len: int  # a bound on own_lens (the captured bound in a graph)


class StepPlans:
    """An engine's decode plans: one BalancedDecode per sliding window its layers use (made on
    first use), each filled at most once per step, and the cascade (``cascade``, None where it
    is off) for steps whose decode rows share a prefix (shared_prefix_blocks; layers without a
    sliding window).

    Eager steps (``begin_step`` with the decode rows' host lengths and tables): every layer asks
    ``for_layer`` / ``cascade_for_layer``; the first ask fills the plan, and the schedule decides
    (for "auto", prefers_balanced against the layer's partition split). CUDA graphs: a graph is
    captured after ``begin_capture(rows, cascade)``, on the balanced path where the schedule is
    "balanced" (graphs="balanced") and on the cascade path for the cascade variant; before each
    replay the runner refills the plans (``fill_all``, and ``fill_cascade``, which says whether
    the step has a shared prefix for the cascade variant)."""

    def __init__(
        self,
        max_seqs: int,
        num_heads: int,
        head_size: int,
        target_items: int,
        device: Any,
        schedule: str = "auto",
        graphs: str = "partition",
        cascade: Optional[CascadeDecode] = None,
        max_blocks: int = 0,
    ) -> None:
        self.schedule = check_schedule(schedule)
        self.graphs = graphs if schedule != "partition" else "partition"
        self._shape = (max_seqs, num_heads, head_size, target_items, device)
        self.plans: dict[int, BalancedDecode] = {}
        self._lens: Optional[np.ndarray] = None
        self._choice: dict[int, bool] = {}
        self.balanced_layers = 0  # eager layer calls that ran a balanced plan (tests, logs)
        self.cascade_layers = 0  # eager layer calls that ran the cascade
        self.block_size = 0
        # The cascade's plans (its own block size) and fixed tables; max_blocks: the most blocks
        # a sequence may have (max_model_len over the block size).
        self.cascade = cascade
        self.tables = (
            None
            if cascade is None
            else CascadeTables(max_seqs, max_blocks, cascade.block_size, device)
        )
        self._step_tables: Optional[np.ndarray] = None
        self._shared = 0  # this step's shared prefix (blocks)
        self._planned = False  # the cascade's plans and tables hold this step's
        self._graph_cascade = False  # a capture of the cascade variant

    def plan(self, window: int) -> BalancedDecode:
        if window not in self.plans:
            max_seqs, heads, head_size, target, device = self._shape
            self.plans[window] = BalancedDecode(max_seqs, heads, head_size, target, device)
        return self.plans[window]

    def begin_step(
        self,
        decode_lens: Optional[Any],
        decode_tables: Optional[Any] = None,
        block_size: int = 0,
    ) -> None:
        """A new eager step: the decode rows' host lengths and block tables (None: a graph
        capture, see begin_capture)."""
        self._lens = None if decode_lens is None else np.asarray(decode_lens, dtype=np.int32)
        self._choice = {}
        self._planned, self._graph_cascade = False, False
        self._step_tables = None if decode_tables is None else np.asarray(decode_tables)
        self._shared = (
            0
            if self._lens is None or self._step_tables is None or self.cascade is None
            else shared_prefix_blocks(self._lens, self._step_tables, self.cascade.block_size)
        )
        self.block_size = block_size

    def begin_capture(self, rows: int, cascade: bool = False) -> None:
        """Before capturing a graph of ``rows`` rows; ``cascade``: its cascade variant, whose
        plans now hold a placeholder step (one shared block, one own key per row) so that the
        warm-up forward before the capture reads valid ones."""
        self.begin_step(None)
        if cascade:
            assert self.cascade is not None and self.tables is not None
            bs = self.cascade.block_size
            self._plan_cascade(1, np.full(rows, bs + 1, np.int32), np.zeros((rows, 2)), rows)
            self._graph_cascade = True

    def _plan_cascade(self, shared: int, lens: np.ndarray, tables: Any, rows: int) -> None:
        assert self.cascade is not None and self.tables is not None
        keys = shared * self.cascade.block_size
        own = np.asarray(lens, dtype=np.int32) - keys
        self.cascade.plan(keys, own, rows)
        self.tables.fill(shared, own, tables, rows)
        self._planned = True

    def fill_cascade(self, decode_lens: Any, decode_tables: Any, rows: int) -> bool:
        """Before a graph replay of ``rows`` rows: True (the plans and tables refilled) where
        the decode rows share a prefix, for the graph's cascade variant; False for the plain
        one."""
        if self.cascade is None:
            return False
        lens = np.asarray(decode_lens, dtype=np.int32)
        shared = shared_prefix_blocks(lens, decode_tables, self.cascade.block_size)
        if shared == 0:
            return False
        self._plan_cascade(shared, lens, decode_tables, rows)
        return True

    def cascade_for_layer(self, rows: int, window: int, max_len: int) -> Optional[CascadeStep]:
        """This step's cascade for a layer's ``rows`` decode rows (planned at the first layer
        that asks; ``max_len`` bounds the rows' lengths); None where the step has no shared
        prefix or the layer a sliding window."""
        if self.cascade is None or self.tables is None or window:
            return None
        keys = 0
        if self._lens is None:  # a graph capture: the cascade variant's, with a bound
            if not self._graph_cascade:
                return None
        else:
            if self._shared == 0:
                return None
            if not self._planned:
                self._plan_cascade(self._shared, self._lens, self._step_tables, rows)
            keys = self._shared * self.cascade.block_size
            self.cascade_layers += 1
        t = self.tables
        return CascadeStep(
            self.cascade, t.prefix_table, t.own_tables[:rows], t.own_lens[:rows], max_len - keys
        )

    def for_layer(self, window: int, partition_size: int) -> Optional[BalancedDecode]:
        """The plan this layer's decode runs on, or None for the partition split."""
        if self.schedule == "partition":
            return None
        if self._lens is None:  # a graph capture or replay
            return self.plan(window) if self.graphs == "balanced" else None
        if window not in self._choice:
            plan = self.plan(window)
            used = plan.fill(self._lens, window or None)
            self._choice[window] = self.schedule == "balanced" or prefers_balanced(
                self._lens, partition_size, plan.items_host.numpy(), used, window
            )
        if not self._choice[window]:
            return None
        self.balanced_layers += 1
        return self.plans[window]

    def fill_all(self, decode_lens: Any, rows: int) -> None:
        """Before a graph replay of ``rows`` rows: every plan the graphs read, refilled. With
        "auto", a plan whose pieces do not win (prefers_balanced against the single pass) is
        refilled with one item per sequence: the graph's launch runs the single pass's work."""
        if self.graphs != "balanced":
            return
        for window, plan in self.plans.items():
            used = plan.fill(decode_lens, window or None, rows)
            if self.schedule == "auto" and not prefers_balanced(
                decode_lens, 0, plan.items_host.numpy(), used, window
            ):
                plan.fill(decode_lens, window or None, rows, whole=True)
