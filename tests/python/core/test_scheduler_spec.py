"""The speculative-decoding surface of the Python Scheduler: set_draft_tokens, the plan's
num_draft_tokens, update_accepted, num_appended (the C++ rules are tested in
tests/cpp/test_scheduler_spec.cpp)."""

from __future__ import annotations

import numpy as np
import pytest
from pagedkv import Scheduler, SchedulerConfig


def _decoding(block_size: int = 4) -> Scheduler:
    s = Scheduler(SchedulerConfig(32, block_size, max_num_seqs=4, max_num_batched_tokens=64))
    s.add_request("a", list(range(100, 106)), 20)
    s.update(s.schedule(), [500])
    return s


def test_drafts_feed_an_extend_entry_and_update_accepted_rolls_back() -> None:
    s = _decoding()
    free = s.num_free_blocks
    s.set_draft_tokens("a", np.array([601, 602, 603, 604]))
    plan = s.schedule()
    assert plan.num_prefills == 1 and plan.num_draft_tokens_total == 4
    assert np.asarray(plan.num_draft_tokens).tolist() == [4]
    assert np.asarray(plan.input_ids).tolist() == [500, 601, 602, 603, 604]
    assert s.num_free_blocks == free - 1
    with pytest.raises(ValueError, match="update_accepted"):
        s.update(plan, [1])
    with pytest.raises(ValueError, match="differs from its draft"):
        s.update_accepted(plan, [601, 9, 700], [3])
    assert s.update_accepted(plan, [601, 700], [2]) == []
    assert s.num_appended == [2]
    assert s.get_token_ids("a")[-3:] == [500, 601, 700]
    assert s.num_free_blocks == free  # 8 tokens cached: the third block held rejected drafts
    nxt = s.schedule()
    assert nxt.num_draft_tokens_total == 0 and nxt.num_decode_tokens == 1


def test_bad_drafts_and_arguments_are_refused_by_name() -> None:
    s = _decoding()
    with pytest.raises(ValueError, match="draft_token_ids"):
        s.set_draft_tokens("a", [1, -2])
    with pytest.raises(ValueError, match="request_id"):
        s.set_draft_tokens("zz", [1])
    with pytest.raises(TypeError, match="request_id"):
        s.set_draft_tokens(3, [1])  # type: ignore[arg-type]
    plan = s.schedule()
    with pytest.raises(TypeError, match="num_accepted"):
        s.update_accepted(plan, [1], "x")
    with pytest.raises(ValueError, match="num_accepted"):
        s.update_accepted(plan, [1], [1, 1])
    assert s.update_accepted(plan, np.array([7], dtype=np.int64), np.array([1])) == []
