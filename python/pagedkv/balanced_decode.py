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
    """The "auto" rule: the balanced plan (work_items, its first ``used`` items filled) where its
    longest piece is at most AUTO_GAIN of the longest CTA of the partition split
    (``partition_size`` keys, or a whole visible context when 0)."""
    lens = np.asarray(seq_lens, dtype=np.int64)
    if lens.size == 0 or used <= 0:
        return False
    longest = int(lens.max())
    if sliding_window and sliding_window > 0:
        longest = min(longest, int(sliding_window) + partition_size)
    critical = min(partition_size, longest) if partition_size > 0 else longest
    return longest_piece(work_items, used) <= AUTO_GAIN * critical


class BalancedDecode:
    """A balanced plan and its workspace for up to ``max_seqs`` sequences on ``device`` (torch):
    host (pinned on CUDA) and device plan arrays, refilled by ``fill`` each step; ``run`` calls
    ops.paged_attention_balanced on the device copy. ``target_items``: the planner's target
    (ops.balanced_decode_target for the caller's query and caches)."""

    def __init__(
        self,
        max_seqs: int,
        num_heads: int,
        head_size: int,
        target_items: int,
        device: Any,
        min_chunk: int = ops.BALANCED_MIN_CHUNK,
    ) -> None:
        import torch

        self.max_seqs, self.target_items, self.min_chunk = max_seqs, target_items, min_chunk
        self.capacity = ops.balanced_plan_capacity(target_items, max_seqs)
        cuda = torch.device(device).type == "cuda"
        n = self.capacity * 3 + max_seqs + 1
        # One buffer for items and offsets: one copy per step.
        self._host = torch.zeros(n, dtype=torch.int32, pin_memory=cuda)
        self._host[: self.capacity * 3].view(self.capacity, 3)[:, 0] = -1  # unused items
        self._dev = self._host.to(device)
        self.items_host = self._host[: self.capacity * 3].view(self.capacity, 3)
        self.offsets_host = self._host[self.capacity * 3 :]
        self.items = self._dev[: self.capacity * 3].view(self.capacity, 3)
        self.offsets = self._dev[self.capacity * 3 :]
        self.exp_sums = torch.empty(self.capacity, num_heads, dtype=torch.float32, device=device)
        self.max_logits = torch.empty_like(self.exp_sums)
        self.tmp_out = torch.empty(
            self.capacity, num_heads, head_size, dtype=torch.float32, device=device
        )
        self._copied = torch.cuda.Event() if cuda else None
        self.used = 0

    def fill(self, seq_lens: Any, sliding_window: Optional[int] = None) -> int:
        """Plans host int32 ``seq_lens`` (numpy or torch, <= max_seqs) into the host arrays and
        queues their copy to the device on the current stream; returns the items used."""
        if self._copied is not None:
            self._copied.synchronize()  # the previous copy has read the pinned buffer
        lens = np.ascontiguousarray(np.asarray(seq_lens, dtype=np.int32))
        n = lens.shape[0]
        if n > self.max_seqs:
            raise ValueError(f"{n} sequences but the plan was made for {self.max_seqs}")
        self.used = ops.plan_balanced_decode(
            lens,
            self.items_host,
            self.offsets_host[: n + 1],
            self.target_items,
            sliding_window,
            self.min_chunk,
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
        ops.paged_attention_balanced(
            out,
            self.exp_sums,
            self.max_logits,
            self.tmp_out,
            query,
            key_cache,
            value_cache,
            num_kv_heads,
            scale,
            block_tables,
            seq_lens,
            self.items,
            self.offsets[: n + 1],
            max_seq_len,
            alibi_slopes,
            kv_cache_dtype,
            k_scale,
            v_scale,
            **kw,
        )
