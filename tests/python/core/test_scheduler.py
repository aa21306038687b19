"""Scheduler through the Python API: the seed traces, views, errors, fork, priorities."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from pagedkv import Scheduler, SchedulerConfig, StepPlan
from support.deps import need
from support.scheduler_checks import Driver, check_plan


def tokens(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(10, 30000, n).tolist()


def test_seed000_chunked_prefill_trace() -> None:
    rng = np.random.default_rng()
    s = Scheduler(SchedulerConfig(1000, 16, max_num_batched_tokens=512))
    a, b = tokens(rng, 484), tokens(rng, 484)
    s.add_request("a", a, 8)
    s.add_request("b", b, 8)
    exp = {"a": list(a), "b": list(b)}

    p = s.schedule()
    assert isinstance(p, StepPlan)
    check_plan(s, p, exp)
    assert (p.num_prefills, p.num_prefill_tokens, p.num_decode_tokens) == (2, 512, 0)
    assert p.request_ids == ["a", "b"]
    assert p.seq_lens.tolist() == [484, 28] and p.query_start_loc.tolist() == [0, 484, 512]
    assert (p.max_query_len, p.max_prefill_seq_len, p.max_decode_seq_len) == (484, 484, 0)
    assert p.sample_indices.tolist() == [483, -1]
    assert [f.request_id for f in s.update(p, [101, -1])] == []
    exp["a"].append(101)

    p = s.schedule()
    check_plan(s, p, exp)
    assert (p.num_prefills, p.num_prefill_tokens, p.num_decode_tokens) == (1, 456, 1)
    assert p.request_ids == ["b", "a"]  # prefills first
    assert p.seq_lens.tolist() == [484, 485] and p.context_lens.tolist() == [28, 484]
    assert p.query_start_loc.tolist() == [0, 456, 457]
    assert p.seq_start_loc.tolist() == [0, 484, 969]
    assert (p.max_query_len, p.max_prefill_seq_len, p.max_decode_seq_len) == (456, 484, 485)
    s.update(p, [202, 102])
    exp["b"].append(202)
    exp["a"].append(102)

    p = s.schedule()
    check_plan(s, p, exp)
    assert (p.num_prefills, p.num_decode_tokens, p.max_query_len) == (0, 2, 1)
    assert sorted(p.seq_lens.tolist()) == [485, 486] and p.max_decode_seq_len == 486
    assert p.seq_start_loc[-1] == 971
    for i in range(2):  # every slot follows the block table
        pos = int(p.positions[i])
        assert p.slot_mapping[i] == p.block_tables[i][pos // 16] * 16 + pos % 16
    s.update(p, [1, 2])
    assert s.abort_request("a") and s.abort_request("b")
    assert s.num_free_blocks == 1000 and s.kv_cache_usage == 0.0


def test_seed002_token_granular_prefix_reuse() -> None:
    s = Scheduler(SchedulerConfig(64, 1))
    first = [1, 29871, 29896, 29906, 29941, 29946, 29945]
    second = first + [29896, 29906, 29941, 29946, 29945]
    s.add_request("first", first, 1)
    assert [f.request_id for f in s.update(s.schedule(), [5])] == ["first"]
    s.add_request("second", second, 1)
    p = s.schedule()
    assert p.num_seqs == 1 and p.context_lens.tolist() == [7] and p.seq_lens.tolist() == [12]
    assert p.positions.tolist() == [7, 8, 9, 10, 11]
    assert p.input_ids.tolist() == second[7:]
    assert s.prefix_cache_hit_tokens == 7
    assert s.prefix_cache_query_tokens == len(first) + len(second)
    s.update(p, [3])
    assert s.num_free_blocks == 64


def test_views_are_zero_copy_and_keep_the_scheduler_alive() -> None:
    s = Scheduler(SchedulerConfig(64, 4, max_num_seqs=8, max_num_batched_tokens=64))
    s.add_request("x", [5, 6, 7, 8, 9], 3)
    p = s.schedule()
    a, b = p.input_ids, p.input_ids
    assert np.shares_memory(a, b), "each access views the same C++ buffer"
    assert a.dtype == np.int32 and p.slot_mapping.dtype == np.int64
    assert p.blocks_to_copy.shape == (0, 2) and p.blocks_to_copy.dtype == np.int64
    del s, p
    gc.collect()
    assert a.tolist() == [5, 6, 7, 8, 9]  # the view owns the plan, which owns the scheduler


def test_update_accepts_lists_numpy_and_torch() -> None:
    torch = need("torch")
    s = Scheduler(SchedulerConfig(64, 4))
    for i in range(3):
        s.add_request(f"r{i}", [1, 2, 3], 4)
    s.update(s.schedule(), [7, 8, 9])
    s.update(s.schedule(), np.array([7, 8, 9], dtype=np.int32))
    s.update(s.schedule(), torch.tensor([7, 8, 9]))
    assert [f.request_id for f in s.update(s.schedule(), np.array([7, 8, 9]))] == ["r0", "r1", "r2"]
    assert s.num_free_blocks == 64


def test_bad_input_raises_value_error_naming_the_argument() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        SchedulerConfig(0, 16)
    with pytest.raises(ValueError, match="block_size"):
        SchedulerConfig(16, 0)
    with pytest.raises(ValueError, match="preemption_mode"):
        SchedulerConfig(16, 16, preemption_mode="drop")
    with pytest.raises(ValueError, match="policy"):
        SchedulerConfig(16, 16, policy="random")
    with pytest.raises(ValueError, match="num_cpu_blocks"):
        SchedulerConfig(16, 16, preemption_mode="swap")
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        SchedulerConfig(16, 16, enable_chunked_prefill=False, max_model_len=4096)
    s = Scheduler(SchedulerConfig(4, 4, max_model_len=64))
    with pytest.raises(ValueError, match="prompt_token_ids"):
        s.add_request("e", [], 1)
    with pytest.raises(ValueError, match="prompt_token_ids"):
        s.add_request("n", [1, -1], 1)
    with pytest.raises(ValueError, match="max_tokens"):
        s.add_request("z", [1], 0)
    with pytest.raises(ValueError, match="max_model_len"):
        s.add_request("long", [1] * 60, 10)
    with pytest.raises(ValueError, match="num_blocks"):
        s.add_request("big", [1] * 14, 4)  # 17 cached tokens > 4 blocks of 4: could never run
    s.add_request("ok", [1] * 13, 4)
    with pytest.raises(ValueError, match="request_id"):
        s.add_request("ok", [1], 1)
    assert s.abort_request("nope") is False
    p = s.schedule()
    with pytest.raises(ValueError, match="update"):
        s.schedule()
    with pytest.raises(ValueError, match="sampled_token_ids"):
        s.update(p, [])
    with pytest.raises(ValueError, match="sampled_token_ids"):
        s.update(p, [-3])
    s.update(p, [3])
    with pytest.raises(ValueError, match="request_id"):
        s.get_token_ids("nope")
    assert s.abort_request("ok") and s.num_free_blocks == 4 and not s.has_unfinished_requests()


def test_stop_rules_eos_stop_ids_min_tokens_ignore_eos() -> None:
    s = Scheduler(SchedulerConfig(64, 4))
    s.add_request("eos", [1, 2], 10, eos_token_id=0)
    s.add_request("stop", [1, 2], 10, stop_token_ids=[5, 6])
    s.add_request("min", [1, 2], 10, eos_token_id=0, min_tokens=2)
    s.add_request("ign", (1, 2), 2, eos_token_id=0, ignore_eos=True, stop_token_ids=None)
    assert [f.request_id for f in s.update(s.schedule(), [0, 6, 0, 0])] == ["eos", "stop"]
    assert [f.request_id for f in s.update(s.schedule(), [0, 0])] == ["min", "ign"]
    assert s.num_free_blocks == 64


def test_fork_shares_prompt_blocks_and_copies_the_partial_block_on_write() -> None:
    s = Scheduler(SchedulerConfig(32, 4))
    prompt = [11, 12, 13, 14, 15, 16]  # one full block + a partial one
    s.add_request("p", prompt, 3, eos_token_id=2)
    s.update(s.schedule(), [50])
    free = s.num_free_blocks
    assert s.fork("p", "c", 60) is None
    assert s.fork("p", "d", 2) is not None and "d" not in s  # stop token: finished at once
    assert s.num_free_blocks == free
    assert s.get_token_ids("c") == prompt + [60] and s.get_num_generated("c") == 1
    p = s.schedule()
    check_plan(s, p, {"p": prompt + [50], "c": prompt + [60]})
    bt = p.block_tables
    assert bt[0][0] == bt[1][0], "the full prompt block stays shared"
    assert bt[0][1] != bt[1][1]
    ((src, dst),) = p.blocks_to_copy.tolist()
    assert {src, dst} == {int(bt[0][1]), int(bt[1][1])}
    s.update(p, [51, 61])
    with pytest.raises(ValueError, match="parent_id"):
        s.fork("p", "late", 1)
    s.update(s.schedule(), [52, 62])
    assert not s.has_unfinished_requests() and s.num_free_blocks == 32


def test_priority_policy_admits_higher_priority_first() -> None:
    s = Scheduler(SchedulerConfig(64, 4, max_num_seqs=2, policy="priority"))
    d = Driver(s)
    d.add("low1", [1, 2, 3], 4, priority=5)
    d.add("low2", [1, 2, 3], 4, priority=5)
    d.add("high", [1, 2, 3], 4, priority=-1)
    ids, _ = d.step()
    assert ids == ["high", "low1"]
    d.run_to_end()
    fcfs = Scheduler(SchedulerConfig(64, 4, max_num_seqs=2))
    d = Driver(fcfs)
    for rid, pr in (("low1", 5), ("low2", 5), ("high", -1)):
        d.add(rid, [1, 2, 3], 4, priority=pr)
    assert d.step()[0] == ["low1", "low2"]  # fcfs ignores priorities
    d.run_to_end()


def test_priority_decides_the_preemption_victim() -> None:
    s = Scheduler(SchedulerConfig(6, 4, policy="priority"))
    d = Driver(s)
    d.add("vip", [1] * 8, 12, priority=0)
    d.add("bulk", [2] * 8, 12, priority=9)
    while s.num_preemptions == 0:
        d.step()
    assert s.num_waiting == 1 and s.get_num_generated("vip") >= s.get_num_generated("bulk")
    ids, _ = d.step()
    assert ids == ["vip"]
    d.run_to_end()
    assert s.num_free_blocks == 6


def test_abort_between_schedule_and_update() -> None:
    s = Scheduler(SchedulerConfig(32, 4))
    s.add_request("a", [1, 2, 3], 5)
    s.add_request("b", [4, 5, 6], 5)
    p = s.schedule()
    assert s.abort_request("a")
    assert p.request_ids == [None, "b"]
    assert [f.request_id for f in s.update(p, [9, 9])] == []
    assert s.get_num_generated("b") == 1
    assert s.abort_request("b") and s.num_free_blocks == 32


def test_no_chunking_schedules_whole_prompts() -> None:
    s = Scheduler(SchedulerConfig(100, 4, max_num_batched_tokens=32, enable_chunked_prefill=False))
    d = Driver(s)
    d.add("a", list(range(10, 30)), 3)
    d.add("b", list(range(40, 60)), 3)
    ids, _ = d.step()
    assert ids == ["a"]  # 20 + 20 > 32: b waits instead of being chunked
    plan_ids, _ = d.step()
    assert plan_ids == ["b", "a"]
    d.run_to_end()
    assert s.num_free_blocks == 100


def test_fork_after_the_parent_finished_on_its_first_token() -> None:
    # n > 1 sampling where the parent samples eos but a sibling does not: the child still runs,
    # re-prefilling its prompt (from the prefix cache) since the parent's blocks are gone.
    s = Scheduler(SchedulerConfig(32, 4))
    d = Driver(s)  # its KV model must see the parent's prefill
    prompt = [11, 12, 13, 14, 15, 16, 17, 18, 19]
    s.add_request("p", prompt, 3, eos_token_id=2)
    plan = s.schedule()
    d.kv.run(plan, {"p": prompt})
    assert [f.request_id for f in s.update(plan, [2])] == ["p"]
    assert s.num_free_blocks == 32
    assert s.fork("p", "c", 40) is None
    assert s.fork("p", "d", 41) is None
    d.tokens = {"c": prompt + [40], "d": prompt + [41]}
    d.prompt_len = {"c": len(prompt), "d": len(prompt)}
    d.params = {"c": {"max_tokens": 3}, "d": {"max_tokens": 3}}
    d.eos = 2
    ids, _ = d.step()
    assert sorted(ids) == ["c", "d"]
    assert s.prefix_cache_hit_tokens == 16  # both reuse the prompt's two full blocks
    d.run_to_end()
    assert set(d.finished) == {"c", "d"} and s.num_free_blocks == 32
    with pytest.raises(ValueError, match="parent_id"):
        s.fork("p", "e", 1)  # only right after that update()


def test_concurrent_calls_raise_instead_of_racing() -> None:
    import threading

    s = Scheduler(SchedulerConfig(4096, 16, max_num_seqs=512, max_num_batched_tokens=8192))
    for i in range(512):
        s.add_request(f"r{i}", [1] * 16, 200)
    errors: list[BaseException] = []
    stop = threading.Event()

    def poke() -> None:
        while not stop.is_set():
            try:
                s.abort_request("nope")
            except RuntimeError as e:
                errors.append(e)
                return

    t = threading.Thread(target=poke)
    t.start()
    try:
        for _ in range(300):
            p = s.schedule()
            s.update(p, np.full(p.num_seqs, 5))
            if errors:
                break
    finally:
        stop.set()
        t.join()
    # Either the poker hit a schedule()/update() in flight (RuntimeError) or never overlapped;
    # in no case may the scheduler's state be corrupted.
    assert all("thread" in str(e) for e in errors)
    while s.has_unfinished_requests():
        p = s.schedule()
        s.update(p, np.full(p.num_seqs, 5))
    assert s.num_free_blocks == 4096


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_waiting_high_priority_preempts_low_priority_running(mode: str) -> None:
    def run(policy: str) -> tuple[list[str], Scheduler]:
        s = Scheduler(
            SchedulerConfig(
                16, 4, max_num_seqs=4, policy=policy, preemption_mode=mode, num_cpu_blocks=32
            )
        )
        d = Driver(s, seed=3)
        for i in range(4):
            d.add(f"low{i}", list(range(20 + i, 28 + i)), 8, priority=5)
        for _ in range(3):
            d.step()
        d.add("vip", [7, 8, 9, 10], 2, priority=0)
        ids, _ = d.step()
        d.run_to_end()
        assert s.num_free_blocks == 16 and s.num_swapped == 0
        assert set(d.finished) == {"low0", "low1", "low2", "low3", "vip"}
        return ids, s

    ids, s = run("priority")
    assert "vip" in ids, "no seat: the lowest-priority running request gives it up"
    assert s.num_preemptions >= 1
    ids, _ = run("fcfs")
    assert "vip" not in ids


def test_config_repr_round_trips_and_exposes_fields() -> None:
    cfg = SchedulerConfig(
        100,
        8,
        max_num_seqs=7,
        max_num_batched_tokens=99,
        enable_chunked_prefill=False,
        enable_prefix_caching=False,
        num_cpu_blocks=5,
        preemption_mode="swap",
        policy="priority",
        max_model_len=64,
    )
    again = eval(repr(cfg), {"SchedulerConfig": SchedulerConfig})
    fields = (
        "num_blocks",
        "block_size",
        "max_num_seqs",
        "max_num_batched_tokens",
        "enable_chunked_prefill",
        "enable_prefix_caching",
        "num_cpu_blocks",
        "preemption_mode",
        "policy",
        "max_model_len",
        "max_blocks_per_seq",
    )
    assert [getattr(again, f) for f in fields] == [getattr(cfg, f) for f in fields]
    assert (cfg.max_model_len, cfg.max_blocks_per_seq) == (64, 8)
    assert SchedulerConfig(10, 16).max_model_len == 160  # default: the cache capacity
