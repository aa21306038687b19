"""Scheduler policy rules on small hand-traced cases, each written so that breaking the rule
changes the plan (found by mutation testing: these rules survived every other test).

Every expectation below is derived by hand from the documented rules (scheduler.h,
docs/metadata.md):
block size 4, so a sequence of n tokens holds ceil(n / 4) blocks.
"""

from __future__ import annotations

from pagedkv import Scheduler, SchedulerConfig


def _step(s: Scheduler, token: int = 1) -> tuple[list, list[int], list[str]]:
    """One schedule() + update() feeding `token` to every sampled row: (ids, seq_lens, done)."""
    p = s.schedule()
    ids, lens = list(p.request_ids), p.seq_lens.tolist()
    done = [f.request_id for f in s.update(p, [token] * p.num_seqs)]
    return ids, lens, done


def test_no_admission_in_a_step_that_preempted() -> None:
    # Priority policy so that the waiting request C (priority 3) queues ahead of the preempted
    # B (priority 5): C would fit in the blocks B frees, but a step that preempted admits nobody.
    s = Scheduler(SchedulerConfig(5, 4, policy="priority", enable_prefix_caching=False))
    s.add_request("A", list(range(10, 18)), 10, priority=0)  # 8 tokens: 2 blocks
    s.add_request("B", list(range(20, 28)), 10, priority=5)  # 8 tokens: 2 blocks
    assert _step(s)[:2] == (["A", "B"], [8, 8])
    assert s.num_free_blocks == 1
    s.add_request("C", list(range(30, 34)), 1, priority=3)  # 4 tokens: 1 block
    # C outranks B but fits in the free block: no priority preemption.
    # A's 9th token takes the free block; B's 9th token finds none, and B (the latest unscheduled
    # running sequence) preempts itself: its 2 blocks come back. C must still wait.
    p = s.schedule()
    assert list(p.request_ids) == ["A"]
    assert s.num_preemptions == 1 and s.num_waiting == 2 and s.num_free_blocks == 2
    s.update(p, [1])
    # Next step: C (ahead of B) is admitted; B needs ceil(10 / 4) = 3 blocks to resume, 1 is left.
    p = s.schedule()
    assert (list(p.request_ids), p.seq_lens.tolist()) == (["C", "A"], [4, 10])
    assert s.num_waiting == 1 and s.num_free_blocks == 1
    assert [f.request_id for f in s.update(p, [1, 1])] == ["C"]


def test_equal_priority_never_preempts() -> None:
    def run(waiting_priority: int) -> tuple[list, int]:
        s = Scheduler(SchedulerConfig(2, 4, policy="priority", enable_prefix_caching=False))
        s.add_request("R", [11, 12, 13, 14, 15], 3, priority=5)  # 5..8 tokens: 2 blocks, all
        _step(s)
        s.add_request("W", [21, 22, 23, 24], 2, priority=waiting_priority)
        p = s.schedule()
        ids = list(p.request_ids)
        s.update(p, [1] * p.num_seqs)
        return ids, s.num_preemptions

    # Same priority: W waits for room, R keeps running.
    assert run(5) == (["R"], 0)
    # Strictly higher priority: a seat is free but no block is, so R gives W its place.
    assert run(4) == (["W"], 1)


def test_preempted_request_resumes_only_when_its_whole_prefill_and_next_token_fit() -> None:
    s = Scheduler(SchedulerConfig(6, 4, enable_prefix_caching=False))
    s.add_request("A", list(range(10, 22)), 8)  # 12 tokens: 3 blocks
    s.add_request("C", list(range(30, 33)), 4)  # 3 tokens: 1 block
    s.add_request("B", list(range(40, 47)), 8)  # 7 tokens: 2 blocks
    assert _step(s)[:2] == (["A", "C", "B"], [12, 3, 7])
    assert s.num_free_blocks == 0
    # A's 13th token needs a 4th block: B, the latest running sequence, is preempted
    # (recompute); it now has 8 tokens and computed none.
    ids, lens, _ = _step(s)
    assert (ids, lens) == (["A", "C"], [13, 4]) and s.num_preemptions == 1
    assert (_step(s)[:2]) == (["A", "C"], [14, 5])
    assert _step(s) == (["A", "C"], [15, 6], ["C"])  # C's 4th token: done, 2 blocks free
    # 2 free blocks hold B's 8 tokens, but resuming needs its 8 tokens plus the next one:
    # ceil(9 / 4) = 3 blocks. B waits instead of being preempted again at its next token.
    assert s.num_free_blocks == 2
    ids, lens, _ = _step(s)
    assert (ids, lens) == (["A"], [16]) and s.num_waiting == 1
    while "A" not in _step(s)[2]:
        pass
    # A finished (20 tokens): B resumes with all 8 tokens in one chunk and 3 blocks reserved.
    p = s.schedule()
    assert list(p.request_ids) == ["B"] and p.seq_lens.tolist() == [8]
    assert p.context_lens.tolist() == [0] and s.num_free_blocks == 3
    s.update(p, [1])
    assert s.num_preemptions == 1


def test_running_prefill_is_chunked_again_at_the_full_budget() -> None:
    # 1200 prompt tokens under a 512-token budget: 512, 512, then the last 176.
    s = Scheduler(SchedulerConfig(200, 16, max_num_batched_tokens=512))
    s.add_request("a", [7] * 1200, 2)
    for seq_len, ctx in ((512, 0), (1024, 512), (1200, 1024)):
        p = s.schedule()
        assert p.seq_lens.tolist() == [seq_len] and p.context_lens.tolist() == [ctx]
        assert p.num_prefill_tokens == seq_len - ctx
        s.update(p, [1])
    # A decode and a new prompt share one budget: 1 + 511.
    s.add_request("b", [8] * 600, 1)
    p = s.schedule()
    assert list(p.request_ids) == ["b", "a"]
    assert p.query_start_loc.tolist() == [0, 511, 512]
    s.update(p, [1, 1])
    p = s.schedule()
    assert list(p.request_ids) == ["b"] and p.seq_lens.tolist() == [600]
    assert p.context_lens.tolist() == [511]
    s.update(p, [1])
    assert not s.has_unfinished_requests() and s.num_free_blocks == 200


def test_block_table_rows_are_padded_after_a_longer_previous_occupant() -> None:
    # Row 0 first holds A's 10 blocks, then B's single block: the rest of the row must read as
    # the documented pad (0), not A's stale block ids (mutation testing: not clearing them
    # passed every test, since the checks only read entries below seq_len).
    s = Scheduler(SchedulerConfig(16, 4, enable_prefix_caching=False))
    s.add_request("A", list(range(100, 140)), 1)  # 40 tokens: 10 blocks
    p = s.schedule()
    assert sum(1 for b in p.block_tables[0] if b != 0) >= 9  # ten distinct ids, one may be 0
    assert [f.request_id for f in s.update(p, [1])] == ["A"]
    s.add_request("B", [7, 8, 9], 2)
    p = s.schedule()
    assert list(p.request_ids) == ["B"]
    assert p.block_tables.shape[1] == 16  # max_model_len defaults to the cache: 16 blocks
    assert p.block_tables[0][1:].tolist() == [0] * 15
    s.update(p, [1])


def test_forked_child_inherits_the_parents_priority() -> None:
    # P (priority 5) and its child C hold both seats; W (priority 3) takes a seat from the
    # lowest-priority, latest running sequence: C, as C has P's priority and arrived later.
    s = Scheduler(
        SchedulerConfig(8, 4, policy="priority", max_num_seqs=2, enable_prefix_caching=False)
    )
    s.add_request("P", [11, 12, 13, 14, 15, 16], 6, priority=5)
    _step(s)
    assert s.fork("P", "C", 2) is None
    s.add_request("W", [21, 22, 23, 24], 2, priority=3)
    ids, lens, _ = _step(s)
    assert (ids, lens) == (["W", "P"], [4, 7])
    assert s.num_preemptions == 1 and s.num_waiting == 1


def test_fork_without_a_free_seat_waits() -> None:
    s = Scheduler(SchedulerConfig(16, 4, max_num_seqs=1))
    s.add_request("P", [11, 12, 13, 14, 15, 16], 3)
    _step(s)
    assert s.fork("P", "C", 2) is None
    assert s.num_running == 1 and s.num_waiting == 1
    assert _step(s)[:2] == (["P"], [7])
    while s.has_unfinished_requests():
        ids, _, _ = _step(s)
        assert len(ids) == 1
    assert s.num_free_blocks == 16


def test_a_new_request_in_a_recycled_slot_is_not_treated_as_resumed() -> None:
    # B is preempted once, then finishes; its slot goes to N. N is new: it reserves blocks for
    # its first chunk only (8 tokens, 2 blocks), not for its whole prompt + 1 (4 blocks).
    s = Scheduler(SchedulerConfig(6, 4, max_num_batched_tokens=8, enable_prefix_caching=False))
    s.add_request("A", list(range(10, 18)), 8)
    s.add_request("B", list(range(20, 28)), 8)
    while s.has_unfinished_requests():
        _step(s)
    assert s.num_preemptions == 1 and s.num_free_blocks == 6
    # Finished slots are recycled at the next schedule(), the last finished (B's) handed out
    # first: an empty step, then N.
    assert s.schedule().num_seqs == 0
    s.add_request("N", list(range(30, 45)), 1)  # 15 tokens
    p = s.schedule()
    assert list(p.request_ids) == ["N"] and p.seq_lens.tolist() == [8]
    assert s.num_free_blocks == 4
    s.update(p, [-1])
