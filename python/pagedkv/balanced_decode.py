"""Work-balanced decode: a plan per step and the rule that picks it (docs/kernels.md, "Decode").

The partition split of ``paged_attention_v2`` depends on the batch size and the longest
sequence, so in a batch of skewed lengths one long sequence keeps a few CTAs busy while the rest
of the GPU idles. ``ops.plan_balanced_decode`` cuts every sequence's keys into pieces of
near-equal length from the host's ``seq_lens`` (the total work over the items the GPU runs at
once) and ``ops.paged_attention_balanced`` runs one item per CTA row, then merges each
sequence's partials.

``BalancedDecode`` keeps a plan and its workspace at a fixed capacity on one device: the engine
refills it every step (one host -> device copy) and a captured CUDA graph replays it, since the
launch shapes depend on the capacity only. ``prefers_balanced`` is the "auto" rule.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from pagedkv import ops

#: Schedules of a decode call: "partition" (paged_attention_v1 / v2 with the library's split),
#: "balanced" (paged_attention_balanced), "auto" (prefers_balanced decides).
DECODE_SCHEDULES = ("auto", "partition", "balanced")

# "auto" takes the balanced plan where its longest piece is at most this fraction of the
# partition split's longest CTA (the time of a skewed batch is that CTA's; a plan that shortens
# it by less does not pay for its partial writes and merge). First setting: skewed batches only;
# benchmarks/gpu_attention.py's skewed table is the evidence.
AUTO_GAIN = 0.5
# ... and only for a skewed batch, its longest sequence at least this many times the mean: on
# uniform lengths the balanced plan measured slower than the split at B = 16 (29.0 vs 23.1 us)
# and B = 64 (78.1 vs 75.8 us), H200, 438280a, gpu_attention.py --skewed-only; every Zipf row
# (longest 4.7-103x the mean) ran 2.2-5.0x faster balanced.
AUTO_SKEW = 2.0

# What an engine's CUDA graphs capture ("partition" or "balanced"): one schedule per graph, fixed
# at capture. "partition" until the skewed and uniform tables show the balanced plan never slower.
GRAPH_SCHEDULE = "partition"


# Work items a plan aims at, in "waves" of the items the GPU runs at once
# (ops.balanced_decode_target). One wave leaves the pieces as long as a slot's whole share, so
# the sequences' rounded-up piece counts spill into a second, part-empty wave; more waves shorten
# the pieces (the tail of list scheduling is one piece) at the cost of more partials to merge.
TARGET_WAVES = 2


def target_items(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    num_kv_heads: int,
    kv_cache_dtype: str = "auto",
    kernel: str = "auto",
    waves: int = TARGET_WAVES,
) -> int:
    """The planner's target_items for a call: ``waves`` x ops.balanced_decode_target."""
    per_wave = ops.balanced_decode_target(
        query, key_cache, value_cache, num_kv_heads, kv_cache_dtype, kernel
    )
    return waves * per_wave


def check_schedule(schedule: str) -> str:
    if schedule not in DECODE_SCHEDULES:
        raise ValueError(f"schedule must be one of {DECODE_SCHEDULES}, got {schedule!r}")
    return schedule


def longest_piece(work_items: Any, used: int) -> int:
    """The most keys one work item of a filled plan attends (0 for an empty plan)."""
    if used <= 0:
        return 0
    items = np.asarray(work_items)[:used]
    return int((items[:, 2] - items[:, 1]).max())


def prefers_balanced(
    seq_lens: Any, partition_size: int, work_items: Any, used: int, sliding_window: int = 0
) -> bool:
    """The "auto" rule: the balanced plan (work_items, its first ``used`` items filled) for a
    skewed batch (longest visible context >= AUTO_SKEW x the mean) where its longest piece is at
    most AUTO_GAIN of the longest CTA of the partition split (``partition_size`` keys, or a
    whole visible context when 0)."""
    lens = np.asarray(seq_lens, dtype=np.int64)
    if lens.size == 0 or used <= 0:
        return False
    if sliding_window and sliding_window > 0:
        lens = np.minimum(lens, int(sliding_window))
    longest = int(lens.max())  # the most keys one sequence's query sees
    if longest < AUTO_SKEW * float(lens.mean()):
        return False
    critical = min(partition_size, longest) if partition_size > 0 else longest
    return longest_piece(work_items, used) <= AUTO_GAIN * critical


class BalancedDecode:
    """A balanced plan and its workspace for up to ``max_seqs`` sequences on ``device`` (torch):
    host (pinned on CUDA) and device plan arrays, refilled by ``fill`` each step; ``run`` calls
    ops.paged_attention_balanced on the device copy. ``target_items``: the planner's target
    (target_items() for the caller's query and caches). ``workspace=False``: no partials'
    workspace of its own; ``run`` allocates it per call (the cascade's per-batch-size prefix
    plans: under a CUDA graph capture the graph's pool holds it, shared with other sizes)."""

    def __init__(
        self,
        max_seqs: int,
        num_heads: int,
        head_size: int,
        target_items: int,
        device: Any,
        min_chunk: int = ops.BALANCED_MIN_CHUNK,
        pin: bool = True,
        workspace: bool = True,
    ) -> None:
        import torch

        self.max_seqs, self.target_items, self.min_chunk = max_seqs, target_items, min_chunk
        self.capacity = ops.balanced_plan_capacity(target_items, max_seqs)
        # Pinned host arrays make the per-step copy asynchronous (plans kept across steps);
        # pin=False suits a plan made for one step (pinning costs more than it saves there).
        cuda = torch.device(device).type == "cuda" and pin
        k = ops.BALANCED_ITEM_INTS
        n = self.capacity * k + max_seqs + 1
        # One buffer for items and offsets: one copy per step.
        self._host = torch.zeros(n, dtype=torch.int32, pin_memory=cuda)
        self._host[: self.capacity * k].view(self.capacity, k)[:, 0] = -1  # unused items
        self._dev = self._host.to(device)
        self.items_host = self._host[: self.capacity * k].view(self.capacity, k)
        self.offsets_host = self._host[self.capacity * k :]
        self.items = self._dev[: self.capacity * k].view(self.capacity, k)
        self.offsets = self._dev[self.capacity * k :]
        self.num_heads, self.head_size = num_heads, head_size
        none: tuple[Any, Any, Any] = (None, None, None)
        self.exp_sums, self.max_logits, self.tmp_out = (
            self._workspace(self.capacity, device) if workspace else none
        )
        self._copied = torch.cuda.Event() if cuda else None
        self.used = 0

    def _workspace(self, capacity: int, device: Any) -> tuple[Any, Any, Any]:
        """exp_sums, max_logits [capacity, num_heads] and tmp_out [capacity, num_heads,
        head_size], float32."""
        import torch

        exp_sums = torch.empty(capacity, self.num_heads, dtype=torch.float32, device=device)
        tmp_out = torch.empty(
            capacity, self.num_heads, self.head_size, dtype=torch.float32, device=device
        )
        return exp_sums, torch.empty_like(exp_sums), tmp_out

    def capacity_for(self, rows: int) -> int:
        """The items of a plan for ``rows`` query rows: the leading part of the buffers, so a
        graph captured for a batch of ``rows`` reads fixed addresses."""
        return ops.balanced_plan_capacity(self.target_items, rows)

    def fill(
        self,
        seq_lens: Any,
        sliding_window: Optional[int] = None,
        rows: Optional[int] = None,
        whole: bool = False,
    ) -> int:
        """Plans host int32 ``seq_lens`` (numpy or torch) for a call of ``rows`` query rows
        (default: one per length; rows past the lengths get no items: zero output) into the host
        arrays and queues their copy to the device on the current stream; returns the items
        used. ``whole``: one item per sequence (the single pass's work, on the same launch: what
        a captured graph runs where the balanced pieces do not win)."""
        if self._copied is not None:
            self._copied.synchronize()  # the previous copy has read the pinned buffer
        lens = np.ascontiguousarray(np.asarray(seq_lens, dtype=np.int32))
        n = lens.shape[0]
        rows = n if rows is None else rows
        if not n <= rows <= self.max_seqs:
            raise ValueError(
                f"{n} sequences in {rows} rows but the plan was made for {self.max_seqs} rows"
            )
        cap = self.capacity_for(rows)
        longest = int(lens.max()) if n else 0
        self.used = ops.plan_balanced_decode(
            lens,
            self.items_host[:cap],
            self.offsets_host[: n + 1],
            self.target_items,
            sliding_window,
            max(self.min_chunk, longest + ops.BALANCED_MIN_CHUNK) if whole else self.min_chunk,
        )
        self.offsets_host[n + 1 :] = self.used  # rows past the planned ones: no items (zeros)
        self._dev.copy_(self._host, non_blocking=self._copied is not None)
        if self._copied is not None:
            self._copied.record()
        return self.used

    def longest_piece(self) -> int:
        return longest_piece(self.items_host.numpy(), self.used)

    def run(
        self,
        out: Any,
        query: Any,
        key_cache: Any,
        value_cache: Any,
        num_kv_heads: int,
        scale: float,
        block_tables: Any,
        seq_lens: Any,
        max_seq_len: int,
        alibi_slopes: Optional[Any] = None,
        kv_cache_dtype: str = "auto",
        k_scale: Any = 1.0,
        v_scale: Any = 1.0,
        **kw: Any,
    ) -> None:
        """ops.paged_attention_balanced over the device plan for query's rows: the sequences of
        the last fill, then (padding rows of a captured batch) rows without items, whose output
        is zero."""
        n = int(query.shape[0])
        cap = self.capacity_for(n)
        if self.exp_sums is None:
            exp_sums, max_logits, tmp_out = self._workspace(cap, self._dev.device)
        else:
            exp_sums, max_logits, tmp_out = (
                self.exp_sums[:cap],
                self.max_logits[:cap],
                self.tmp_out[:cap],
            )
        ops.paged_attention_balanced(
            out,
            exp_sums,
            max_logits,
            tmp_out,
            query,
            key_cache,
            value_cache,
            num_kv_heads,
            scale,
            block_tables,
            seq_lens,
            self.items[:cap],
            self.offsets[: n + 1],
            max_seq_len,
            alibi_slopes,
            kv_cache_dtype,
            k_scale,
            v_scale,
            **kw,
        )
