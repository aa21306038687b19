"""The scheduler decides why a sequence finished and says so through the Python API: several
EOS ids, stop ids, min_tokens, max_tokens; would_finish() and fork() ask the same rule; the
overlapped protocol (advance, schedule, resolve) as the engine drives it."""

from __future__ import annotations

import numpy as np
import pytest
from pagedkv import Scheduler, SchedulerConfig


def _reasons(done: list) -> list[tuple]:
    return [(f.request_id, f.reason, f.stop_token_id, f.is_eos) for f in done]


def test_update_reports_eos_stop_ids_and_length() -> None:
    s = Scheduler(SchedulerConfig(64, 4))
    s.add_request("eos2", [1, 2], 10, eos_token_ids=[3, 4])
    s.add_request("eos1", [1, 2], 10, eos_token_ids=[3, 4])
    s.add_request("stop", [1, 2], 10, eos_token_ids=[3], stop_token_ids=[4, 5])
    s.add_request("len", [1, 2], 1, eos_token_id=3, ignore_eos=True)
    done = s.update(s.schedule(), np.array([4, 3, 4, 3]))
    assert _reasons(done) == [
        ("eos2", "stop", None, True),
        ("eos1", "stop", None, True),
        ("stop", "stop", 4, False),
        ("len", "length", None, False),
    ]
    assert repr(done[2]) == "FinishedRequest(request_id='stop', reason='stop', stop_token_id=4)"
    assert s.num_free_blocks == 64


def test_min_tokens_holds_eos_and_stop_ids() -> None:
    s = Scheduler(SchedulerConfig(64, 4))
    s.add_request("a", [1, 2], 3, eos_token_ids=[3], stop_token_ids=[4], min_tokens=2)
    assert s.would_finish("a", 3) is None  # the first token: before min_tokens
    assert s.update(s.schedule(), [3]) == []
    assert s.would_finish("a", 4).stop_token_id == 4
    assert s.would_finish("a", 9) is None
    assert _reasons(s.update(s.schedule(), [3])) == [("a", "stop", None, True)]


def test_fork_reports_a_child_that_finished_at_once() -> None:
    s = Scheduler(SchedulerConfig(64, 4))
    s.add_request("p", [1, 2, 3], 4, eos_token_ids=[7, 8])
    s.update(s.schedule(), [9])
    assert s.fork("p", "c", 10) is None and "c" in s
    f = s.fork("p", "d", 8)
    assert (f.request_id, f.reason, f.is_eos) == ("d", "stop", True) and "d" not in s


def test_overlap_resolve_drops_the_stopped_sequence_from_the_next_plan() -> None:
    s = Scheduler(SchedulerConfig(64, 4))
    s.add_request("a", [1, 2, 3], 10, eos_token_ids=[7])
    s.add_request("b", [4, 5, 6], 10, eos_token_ids=[7])
    s.advance(s.schedule())
    assert s.has_unresolved_step
    nxt = s.schedule()
    assert nxt.input_ids.tolist() == [-1, -2]  # placeholders: plan entries 0 and 1
    with pytest.raises(ValueError, match="resolve"):
        s.advance(nxt)
    assert _reasons(s.resolve([7, 11])) == [("a", "stop", None, True)]
    assert nxt.request_ids == [None, "b"]
    s.advance(nxt)
    assert s.resolve(np.array([-1, 12])) == []
    assert s.get_token_ids("b") == [4, 5, 6, 11, 12]
    assert s.abort_request("b") and s.num_free_blocks == 64
