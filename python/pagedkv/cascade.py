"""Cascade (shared-prefix) decode attention: many sequences whose contexts start with the same
cached blocks (a system prompt the prefix cache shares) attend to those blocks once for all of
them, then to their own blocks, and the two results merge by their log-sum-exps
(ops.merge_attn_states).

Why: a plain decode reads the shared blocks once per sequence, so 64 sequences over an 8k-token
prompt read it 64 times. Here the shared pass stacks every sequence's query heads of a KV head
into one GQA group of the "prefix sequence" ([1, kv_heads * seqs * group, head_size]): the
Hopper decode then runs them as 16-head column tiles of its tensor-core tiles over the shared
keys (the CTAs of one piece of the prefix read the same keys together, so HBM sees them about
once), on a balanced plan over the prefix. The own blocks run as an ordinary balanced decode.

Not covered (refused by name): ALiBi and sliding windows (both depend on each query's position,
which the shared pass does not have), prefixes that end inside a block.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from pagedkv import ops
from pagedkv.balanced_decode import BalancedDecode, target_items

# The engine's rule: a decode step runs the cascade where at least CASCADE_MIN_SEQS sequences
# share a prefix of at least CASCADE_MIN_PREFIX keys that covers at least CASCADE_MIN_SHARE of
# the keys they read (the reads it saves: every sequence but one skips the prefix). The 256-key
# floor is vLLM's (use_cascade_attention): below it the saved reads are small next to the extra
# launches (the stacking copy, two passes, the merge). Not measured here yet: gpu_attention.py's
# cascade table has the rule's low end, 4 x (256 + 32) and 8 x (1024 + 64).
CASCADE_MIN_SEQS = 4
CASCADE_MIN_PREFIX = 256
CASCADE_MIN_SHARE = 0.5


def shared_prefix_blocks(seq_lens: Any, block_tables: Any, block_size: int) -> int:
    """Leading blocks every sequence of the batch has in common (the same physical blocks: the
    prefix cache's sharing), whole and filled in all of them; 0 where the batch does not pass
    the engine's rule (CASCADE_MIN_SEQS, CASCADE_MIN_PREFIX, CASCADE_MIN_SHARE)."""
    lens = np.asarray(seq_lens, dtype=np.int64)
    tables = np.asarray(block_tables)
    if lens.shape[0] < CASCADE_MIN_SEQS:
        return 0
    n = min(int(lens.min()) // block_size, tables.shape[1])
    floor = -(-CASCADE_MIN_PREFIX // block_size)  # the blocks the rule needs at least
    if n < floor or not (tables[:, floor - 1] == tables[0, floor - 1]).all():
        return 0  # (the common case of unrelated rows, decided from one column)
    same = (tables[:, :n] == tables[:1, :n]).all(axis=0)
    blocks = int(n if same.all() else np.argmin(same))
    if blocks * block_size < CASCADE_MIN_PREFIX:
        return 0
    if blocks * block_size * lens.shape[0] < CASCADE_MIN_SHARE * lens.sum():
        return 0
    return blocks


def _block_size(key_cache: torch.Tensor) -> int:
    return int(key_cache.shape[3] if key_cache.dim() == 5 else key_cache.shape[1])


class CascadeDecode:
    """Plans for cascade decodes of up to ``query.shape[0]`` rows sharing one prefix: ``plan``
    (host work, once per step) then ``run`` (device work only: a CUDA graph may capture it and
    replay it after ``plan`` refills the plans). A call may have fewer rows than the most
    (``rows``): the suffix plan's buffers serve every row count (their leading part, as
    BalancedDecode does), the prefix pass has one small plan per row count (its target depends on
    the stacked group's size), and the passes' outputs are allocated per call (under a graph
    capture: from the graph's pool, which the graphs of other batch sizes reuse)."""

    def __init__(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        num_kv_heads: int,
        kv_cache_dtype: str = "auto",
        kernel: str = "auto",
        pin: bool = True,
    ) -> None:
        s, h, d = (int(x) for x in query.shape)
        self.max_seqs, self.num_heads, self.head_size = s, h, d
        self.num_kv_heads, self.group = num_kv_heads, h // num_kv_heads
        self.kv_cache_dtype, self.kernel, self.pin = kv_cache_dtype, kernel, pin
        self.dtype = query.dtype
        self.block_size = _block_size(key_cache)
        self._caches = (key_cache, value_cache)
        dev = query.device
        target = target_items(query, key_cache, value_cache, num_kv_heads, kv_cache_dtype, kernel)
        self.suffix_plan = BalancedDecode(s, h, d, target, dev, pin=pin)
        self.prefix_plans: dict[int, BalancedDecode] = {}  # per row count (the stacked group)
        self.prefix_lens = torch.zeros(1, dtype=torch.int32, device=dev)
        self.prefix_len = 0
        self.rows = 0  # the row count of the last plan

    def prefix_plan(self, rows: int) -> BalancedDecode:
        """The shared pass's plan for ``rows`` rows: one "sequence" whose GQA group is every
        row's heads of a KV head ([1, num_heads * rows, head_size]); no workspace of its own."""
        if rows not in self.prefix_plans:
            key_cache, value_cache = self._caches
            stacked = key_cache.new_empty(
                (1, self.num_heads * rows, self.head_size), dtype=self.dtype
            )
            target = target_items(
                stacked,
                key_cache,
                value_cache,
                self.num_kv_heads,
                self.kv_cache_dtype,
                self.kernel,
            )
            self.prefix_plans[rows] = BalancedDecode(
                1,
                self.num_heads * rows,
                self.head_size,
                target,
                stacked.device,
                pin=self.pin,
                workspace=False,
            )
        return self.prefix_plans[rows]

    def plan(self, prefix_len: int, suffix_lens: Any, rows: Optional[int] = None) -> None:
        """Host plans for a shared prefix of ``prefix_len`` keys (whole blocks) and the own
        lengths ``suffix_lens`` (host ints, one per sequence) of a call of ``rows`` query rows
        (default: one per sequence; rows past them get no own keys)."""
        if prefix_len % self.block_size:
            raise ValueError(
                f"prefix_len = {prefix_len} must be whole blocks of {self.block_size} keys "
                "(the shared blocks of the prefix cache)"
            )
        rows = len(suffix_lens) if rows is None else rows
        self.prefix_len, self.rows = prefix_len, rows
        self.prefix_plan(rows).fill([prefix_len])
        self.prefix_lens.fill_(prefix_len)
        self.suffix_plan.fill(suffix_lens, rows=rows)

    def run(
        self,
        out: torch.Tensor,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        scale: float,
        prefix_block_table: torch.Tensor,
        suffix_block_tables: torch.Tensor,
        suffix_lens: torch.Tensor,
        max_suffix_len: int,
        k_scale: Any = 1.0,
        v_scale: Any = 1.0,
        logits_soft_cap: float = 0.0,
    ) -> None:
        """out [rows, num_heads, head_size] = attention of each query over the shared prefix
        (prefix_block_table [1, blocks] int32) then its own keys (suffix_block_tables [rows,
        blocks], suffix_lens [rows] on the device), as planned for ``rows`` rows."""
        s, kvh, g, d = int(query.shape[0]), self.num_kv_heads, self.group, self.head_size
        if s != self.rows:
            raise ValueError(f"the plan is for {self.rows} rows but the query has {s}")
        stacked = query.new_empty((1, kvh * s * g, d))
        # [s, kvh, g, d] -> [kvh, s, g, d]: KV head kvh's stacked group is (sequence, head).
        stacked.view(kvh, s, g, d).copy_(query.reshape(s, kvh, g, d).transpose(0, 1))
        prefix_out = torch.empty_like(stacked)
        prefix_lse = query.new_empty((kvh * s * g, 1), dtype=torch.float32)
        suffix_out = torch.empty_like(query)
        suffix_lse = query.new_empty((kvh * g, s), dtype=torch.float32)
        kw: dict[str, Any] = dict(logits_soft_cap=logits_soft_cap, kernel=self.kernel)
        common = (key_cache, value_cache, kvh, scale)
        # The prefix length as its bound (host checks on the CPU; CUDA kernels read the lengths
        # on the device): a graph replay after a new plan keeps the captured bound, unread there.
        self.prefix_plan(s).run(
            prefix_out,
            stacked,
            *common,
            prefix_block_table,
            self.prefix_lens,
            self.prefix_len,
            None,
            self.kv_cache_dtype,
            k_scale,
            v_scale,
            lse=prefix_lse,
            **kw,
        )
        self.suffix_plan.run(
            suffix_out,
            query,
            *common,
            suffix_block_tables,
            suffix_lens,
            max_suffix_len,
            None,
            self.kv_cache_dtype,
            k_scale,
            v_scale,
            lse=suffix_lse,
            **kw,
        )
        prefix_out = prefix_out.view(kvh, s, g, d).transpose(0, 1).reshape(s, kvh * g, d)
        prefix_lse = prefix_lse.view(kvh, s, g).transpose(1, 2).reshape(kvh * g, s)
        ops.merge_attn_states(out, prefix_out, prefix_lse, suffix_out, suffix_lse)


def cascade_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    num_kv_heads: int,
    scale: float,
    prefix_block_table: torch.Tensor,
    prefix_len: int,
    suffix_block_tables: torch.Tensor,
    suffix_lens: torch.Tensor,
    kv_cache_dtype: str = "auto",
    k_scale: Any = 1.0,
    v_scale: Any = 1.0,
    logits_soft_cap: float = 0.0,
    kernel: str = "auto",
    suffix_lens_cpu: Optional[Any] = None,
) -> torch.Tensor:
    """One cascade decode (CascadeDecode planned and run once): query [num_seqs, num_heads,
    head_size] over a shared prefix of ``prefix_len`` keys (whole blocks, prefix_block_table
    [1, blocks]) followed by each sequence's own ``suffix_lens`` keys (suffix_block_tables). The
    own lengths are read on the host (``suffix_lens_cpu``, else a copy of suffix_lens)."""
    c = CascadeDecode(query, key_cache, value_cache, num_kv_heads, kv_cache_dtype, kernel, False)
    lens = suffix_lens_cpu if suffix_lens_cpu is not None else suffix_lens.cpu()
    c.plan(prefix_len, lens)
    out = torch.empty_like(query)
    max_suffix = int(max(int(x) for x in lens)) if len(lens) else 0
    c.run(
        out,
        query,
        key_cache,
        value_cache,
        scale,
        prefix_block_table,
        suffix_block_tables,
        suffix_lens,
        max_suffix,
        k_scale,
        v_scale,
        logits_soft_cap,
    )
    return out
