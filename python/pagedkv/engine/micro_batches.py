"""A step's plan cut into micro-batches, so that pipeline stages overlap within the step.

With P stages and one batch, each stage idles while the others work (a step costs P stage
times). Cut into M micro-batches, stage s runs micro-batch j while stage s+1 runs j-1: the
step costs (M + P - 1) stage times of 1/M of the batch. That pays when a stage's time
shrinks with its batch, i.e. for compute-bound steps (prefill chunks); a decode step streams
all of a stage's weights whatever its batch, so cutting it would only multiply the weight
reads. Hence the rule: a step is cut by its prefill tokens, into micro-batches of at least
``min_tokens`` of them (a GEMM's compute-bound size), at most ``max_parts``; a decode-only
step is never cut.

A micro-batch is a range of the plan's sequences, itself a PlanArrays obeying the metadata
contract (prefill entries first, query_start_loc from 0, max_query_len and max_decode_seq_len
of its own entries); the sequences' KV blocks are disjoint, so micro-batches never read each
other's cache. The block operations (swap, copy) ride with the first micro-batch, which runs
them before its forward, as a whole step would.
"""

from __future__ import annotations

from typing import List

import numpy as np

from pagedkv.engine.plan_arrays import PlanArrays


def split_plan(plan: PlanArrays, max_parts: int, min_tokens: int) -> List[PlanArrays]:
    """The plan as consecutive micro-batches of about equal token counts (``[plan]`` when it
    is too small to cut, or ``min_tokens`` is 0)."""
    n_seq, n_tok = int(plan.num_seqs), int(plan.num_tokens)
    prefill_tok = int(plan.num_prefill_tokens)
    parts = min(max_parts, n_seq, prefill_tok // min_tokens if min_tokens > 0 else 1)
    if parts <= 1:
        return [plan]
    qsl = np.asarray(plan.query_start_loc[: n_seq + 1], dtype=np.int64)
    # Cut at the sequence boundaries nearest to equal token shares, every part non-empty.
    targets = np.arange(1, parts) * n_tok / parts
    cuts = np.searchsorted(qsl, targets)
    cuts = np.maximum.accumulate(np.clip(cuts, 1, n_seq - 1))
    bounds = sorted({0, n_seq, *cuts.tolist()})
    return [plan_part(plan, a, b, first=(a == 0)) for a, b in zip(bounds, bounds[1:])]


def plan_part(plan: PlanArrays, a: int, b: int, first: bool) -> PlanArrays:
    """The plan's sequences a .. b-1 as a plan of their own; with the plan's block operations
    when ``first`` (none otherwise). Also what a pooling step reruns one sequence with after its
    batch raised (pooling_engine._forward)."""
    qsl = np.asarray(plan.query_start_loc)
    t0, t1 = int(qsl[a]), int(qsl[b])
    query_lens = np.diff(qsl[a : b + 1])
    num_prefills = max(0, min(b, int(plan.num_prefills)) - a)
    num_prefill_tokens = int(query_lens[:num_prefills].sum())
    seq_lens = np.asarray(plan.seq_lens[a:b])
    return PlanArrays(
        step=plan.step,
        num_seqs=b - a,
        num_prefills=num_prefills,
        num_prefill_tokens=num_prefill_tokens,
        num_decode_tokens=(t1 - t0) - num_prefill_tokens,
        num_tokens=t1 - t0,
        max_query_len=int(query_lens.max()),
        max_decode_seq_len=int(seq_lens[num_prefills:].max()) if num_prefills < b - a else 0,
        input_ids=plan.input_ids[t0:t1],
        positions=plan.positions[t0:t1],
        slot_mapping=plan.slot_mapping[t0:t1],
        seq_lens=seq_lens,
        query_start_loc=(qsl[a : b + 1] - t0).astype(qsl.dtype),
        block_tables=plan.block_tables[a:b],
        blocks_to_swap_out=plan.blocks_to_swap_out[: None if first else 0],
        blocks_to_swap_in=plan.blocks_to_swap_in[: None if first else 0],
        blocks_to_copy=plan.blocks_to_copy[: None if first else 0],
    )
