"""The engine's decode plans per step: the work-balanced plans (pagedkv.balanced_decode) and the
cascade over a shared prefix (pagedkv.cascade), decided once per step from the decode rows'
host lengths and block tables, used by every layer (PagedAttentionBackend._decode)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from pagedkv.balanced_decode import BalancedDecode, check_schedule, prefers_balanced
from pagedkv.cascade import CascadeDecode, shared_prefix_blocks


class StepPlans:
    """An engine's decode plans: one BalancedDecode per sliding window its layers use (made on
    first use), each filled at most once per step, and a cascade for steps whose decode rows
    share a prefix (shared_prefix_blocks: eager steps, layers without a sliding window).

    Eager steps (``begin_step`` with the decode rows' host lengths): every layer asks
    ``for_layer``; the first ask of a window fills its plan, and the schedule decides (for
    "auto", prefers_balanced against the layer's partition split). Steps replayed from a CUDA
    graph (``begin_step(None)``): the graph captured the balanced path where the schedule is
    "balanced" (graphs="balanced"), and the runner refills the plans before each replay
    (``fill_all``)."""

    def __init__(
        self,
        max_seqs: int,
        num_heads: int,
        head_size: int,
        target_items: int,
        device: Any,
        schedule: str = "auto",
        graphs: str = "partition",
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
        self._tables: Optional[np.ndarray] = None
        self._shared = 0  # this step's shared prefix (blocks)
        self._cascade: Optional[CascadeDecode] = None
        self._own_lens: Optional[torch.Tensor] = None

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
        """A new step: the decode rows' host lengths and block tables (None: a graph capture
        or replay)."""
        self._lens = None if decode_lens is None else np.asarray(decode_lens, dtype=np.int32)
        self._choice = {}
        self._cascade, self._own_lens = None, None
        self._shared = (
            0
            if self._lens is None or decode_tables is None or self.schedule == "partition"
            else shared_prefix_blocks(self._lens, decode_tables, block_size)
        )
        self.block_size = block_size

    def cascade_for_layer(
        self,
        q: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        num_kv_heads: int,
        kv_cache_dtype: str,
        window: int,
        seq_lens: torch.Tensor,
    ) -> Optional[tuple[CascadeDecode, int, torch.Tensor]]:
        """This step's cascade (planned at the first layer that asks), the shared prefix's
        blocks and the own lengths on the device; None where the step has no shared prefix or
        the layer a sliding window."""
        if self._shared == 0 or window:
            return None
        keys = self._shared * self.block_size
        if self._cascade is None:
            self._cascade = CascadeDecode(
                q, key_cache, value_cache, num_kv_heads, kv_cache_dtype, pin=False
            )
            assert self._lens is not None
            self._cascade.plan(keys, self._lens - keys)
            self._own_lens = seq_lens - keys
        self.cascade_layers += 1
        assert self._own_lens is not None
        return self._cascade, self._shared, self._own_lens

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
