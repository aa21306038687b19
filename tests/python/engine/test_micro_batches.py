"""Pipeline micro-batches: a step's plan cut into consecutive sequence ranges, each obeying the
metadata contract (docs/metadata.md), together exactly the plan."""

from __future__ import annotations

import numpy as np
from support.deps import need

need("torch")

from pagedkv.engine.micro_batches import split_plan  # noqa: E402
from pagedkv.engine.plan_arrays import PlanArrays  # noqa: E402

BLOCK = 16


def _plan(query_lens: list[int], num_prefills: int) -> PlanArrays:
    g = np.random.default_rng(len(query_lens))
    q = np.array(query_lens)
    context = g.integers(0, 40, len(q))
    seq_lens = (context + q).astype(np.int32)
    qsl = np.concatenate([[0], np.cumsum(q)]).astype(np.int32)
    n = int(q.sum())
    positions = np.concatenate([np.arange(c, c + k) for c, k in zip(context, q)]).astype(np.int64)
    width = -(-int(seq_lens.max()) // BLOCK)
    return PlanArrays(
        step=3,
        num_seqs=len(q),
        num_prefills=num_prefills,
        num_prefill_tokens=int(q[:num_prefills].sum()),
        num_decode_tokens=int(q[num_prefills:].sum()),
        num_tokens=n,
        max_query_len=int(q.max()),
        max_decode_seq_len=int(seq_lens[num_prefills:].max()) if num_prefills < len(q) else 0,
        input_ids=g.integers(0, 100, n).astype(np.int32),
        positions=positions,
        slot_mapping=g.integers(0, 1000, n),
        seq_lens=seq_lens,
        query_start_loc=qsl,
        block_tables=g.integers(0, 99, (len(q), width)).astype(np.int32),
        blocks_to_swap_out=np.array([[1, 2]]),
        blocks_to_swap_in=np.array([[3, 4]]),
        blocks_to_copy=np.zeros((0, 2), np.int64),
    )


def _check_contract(p: PlanArrays) -> None:
    q = np.diff(p.query_start_loc)
    assert p.query_start_loc[0] == 0 and p.query_start_loc[-1] == p.num_tokens
    assert p.num_prefill_tokens == q[: p.num_prefills].sum()
    assert p.num_decode_tokens == p.num_tokens - p.num_prefill_tokens
    assert p.max_query_len == q.max()
    decode_lens = p.seq_lens[p.num_prefills :]
    assert p.max_decode_seq_len == (decode_lens.max() if len(decode_lens) else 0)
    assert len(p.input_ids) == len(p.positions) == len(p.slot_mapping) == p.num_tokens
    assert len(p.seq_lens) == len(p.block_tables) == p.num_seqs


def test_prefill_heavy_step_is_cut_into_balanced_parts() -> None:
    plan = _plan([300, 20, 280, 5, 1, 1, 1], num_prefills=4)
    parts = split_plan(plan, max_parts=3, min_tokens=64)
    assert len(parts) == 3
    for p in parts:
        _check_contract(p)
    assert [p.num_seqs for p in parts] == [1, 2, 4]  # cuts near 203 and 406 of 608 tokens
    # Together, in order, exactly the plan; block operations only with the first part.
    for name in ("input_ids", "positions", "slot_mapping", "seq_lens", "block_tables"):
        assert np.array_equal(
            np.concatenate([getattr(p, name) for p in parts]), getattr(plan, name)
        )
    assert sum(p.num_prefills for p in parts) == plan.num_prefills
    assert np.array_equal(parts[0].blocks_to_swap_in, plan.blocks_to_swap_in)
    for p in parts[1:]:
        assert p.blocks_to_swap_out.shape == (0, 2) and p.blocks_to_swap_in.shape == (0, 2)


def _whole(plan: PlanArrays, max_parts: int, min_tokens: int) -> bool:
    parts = split_plan(plan, max_parts, min_tokens)
    return len(parts) == 1 and parts[0] is plan


def test_small_or_decode_only_steps_stay_whole() -> None:
    assert _whole(_plan([1] * 600, num_prefills=0), 4, 8)
    small = _plan([100, 60, 1], num_prefills=2)
    assert _whole(small, 4, 128)  # 160 prefill tokens
    assert _whole(small, 4, 0)
    assert _whole(_plan([500], num_prefills=1), 4, 8)  # one sequence: no cut
    assert len(split_plan(small, 4, 64)) == 2
