"""Stateful random traces: budgets, metadata, preemption in both modes, aborts, forks; every
request ends with exactly the tokens fed to it, and no block leaks."""

from __future__ import annotations

import random

import pytest
from pagedkv import Scheduler, SchedulerConfig
from support.scheduler_checks import Driver


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("seed", range(4))
def test_random_trace_loses_no_token_and_leaks_no_block(mode: str, seed: int) -> None:
    rng = random.Random(seed * 7919 + (mode == "swap"))
    bs = rng.choice([1, 4, 16]) if seed else 4
    cfg = SchedulerConfig(
        num_blocks=rng.choice([1, 2]) * (36 // bs + 4),
        block_size=bs,
        max_num_seqs=rng.choice([8, 16]),
        max_num_batched_tokens=rng.choice([32, 64]),
        enable_chunked_prefill=seed != 3,
        enable_prefix_caching=seed % 2 == 0,
        num_cpu_blocks=64 if mode == "swap" else 0,
        preemption_mode=mode,
        policy="priority" if seed == 2 else "fcfs",
        max_model_len=32,
    )
    s = Scheduler(cfg)
    d = Driver(s, seed=seed, eos=3, eos_rate=0.03)
    shared = [rng.randrange(10, 30000) for _ in range(20)]
    budget_seen = 0
    for step in range(300):
        if rng.random() < 0.6:
            n = rng.randint(1, 24)
            prompt = [rng.randrange(10, 30000) for _ in range(n)]
            if rng.random() < 0.5:
                prompt[: min(n, 20)] = shared[: min(n, 20)]
            max_tokens = rng.randint(1, min(32 - n, 12) if n < 32 else 1)
            if n + max_tokens <= 32:
                d.add(f"r{step}", prompt, max_tokens, priority=rng.randint(0, 3))
        if rng.random() < 0.05 and d.tokens:
            d.abort(rng.choice(sorted(d.tokens)))
        ids, _ = d.step()
        budget_seen = max(budget_seen, len(ids))
    d.run_to_end()
    assert s.num_free_blocks == cfg.num_blocks, "leaked blocks"
    assert s.num_running == s.num_waiting == s.num_swapped == 0
    if mode == "swap":
        assert s.num_free_cpu_blocks == cfg.num_cpu_blocks
    assert d.finished, "trace too easy"


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_storm_finishes_everything_exactly(mode: str) -> None:
    # 24 sequences that each need 12 blocks at the end, in a 40-block cache.
    cfg = SchedulerConfig(
        40, 4, max_num_seqs=32, max_num_batched_tokens=256, preemption_mode=mode, num_cpu_blocks=64
    )
    s = Scheduler(cfg)
    d = Driver(s, seed=1)
    rng = random.Random(1)
    for i in range(24):
        d.add(f"r{i}", [rng.randrange(10, 30000) for _ in range(8)], 40)
    d.run_to_end(max_steps=5000)
    assert len(d.finished) == 24
    assert all(len(t) == 48 for t in d.finished.values())
    assert 5 < s.num_preemptions < 400, s.num_preemptions
    # Work wasted to recomputation stays bounded: no request is preempted again and again.
    assert d.plans < 1500
    assert s.num_free_blocks == 40


def test_forks_under_memory_pressure_leak_nothing() -> None:
    cfg = SchedulerConfig(30, 4, max_num_seqs=16, max_num_batched_tokens=64)
    s = Scheduler(cfg)
    d = Driver(s, seed=5)
    rng = random.Random(5)
    for i in range(6):
        d.add(f"p{i}", [rng.randrange(10, 30000) for _ in range(rng.randint(2, 9))], 8)
    forked = set()
    for _ in range(2000):
        if not s.has_unfinished_requests():
            break
        d.step()
        for rid in list(d.tokens):
            if (
                rid.startswith("p")
                and rid not in forked
                and s.get_num_generated(rid) == 1
                and len(d.tokens[rid]) == d.prompt_len[rid] + 1
            ):
                forked.add(rid)
                try:
                    child = rid.replace("p", "c")
                    first = rng.randrange(10, 30000)
                    if not s.fork(rid, child, first):
                        d.tokens[child] = d.tokens[rid][:-1] + [first]
                        d.prompt_len[child] = d.prompt_len[rid]
                        d.params[child] = d.params[rid]
                except ValueError:
                    pass  # parent was preempted and is re-prefilling: not forkable
    assert not s.has_unfinished_requests()
    assert len(forked) >= 3
    assert s.num_free_blocks == 30


class _EmptyPlanWatch:
    """The scheduler, with every plan of zero sequences checked as it is made: such a plan makes
    LLMEngine.step() return at once, so it must carry no cache work (swaps, copies) and no
    preemption. Delegates everything else to the scheduler."""

    def __init__(self, sched) -> None:
        self._s = sched
        self.empty_plans = 0

    def __getattr__(self, name: str):
        return getattr(self._s, name)

    def schedule(self):
        plan = self._s.schedule()
        if plan.num_seqs == 0:
            self.empty_plans += 1
            work = {
                "swap_out": len(plan.blocks_to_swap_out),
                "swap_in": len(plan.blocks_to_swap_in),
                "copy": len(plan.blocks_to_copy),
                "preempted": len(plan.preempted_ids),
            }
            assert not any(work.values()), f"a plan of 0 sequences carries {work}"
        return plan


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("seed", range(6))
def test_empty_plan_carries_no_block_work(mode: str, seed: int) -> None:
    # Tight caches, few seats, priorities (preempt_for_priority may empty `running`), forks
    # sharing blocks (copy-on-write, swap-out of shared blocks) and aborts.
    rng = random.Random(seed * 104729 + (mode == "swap"))
    bs = rng.choice([1, 2, 4])
    cfg = SchedulerConfig(
        num_blocks=24 // bs + rng.randint(0, 3),
        block_size=bs,
        max_num_seqs=rng.choice([1, 2, 4] if seed < 4 else [4, 8]),
        max_num_batched_tokens=rng.choice([8, 16, 32]) if seed % 3 != 2 else 24,
        enable_chunked_prefill=seed % 3 != 2,
        enable_prefix_caching=seed % 2 == 0,
        num_cpu_blocks=rng.choice([4, 64]),
        preemption_mode=mode,
        policy="priority" if seed < 4 else "fcfs",
        max_model_len=24,
    )
    watch = _EmptyPlanWatch(Scheduler(cfg))
    d = Driver(watch, seed=seed, eos=3, eos_rate=0.03)
    forked: set = set()
    for step in range(400):
        if rng.random() < 0.4:
            n = rng.randint(1, 14)
            prompt = [rng.randrange(10, 30000) for _ in range(n)]
            d.add(
                f"r{step}",
                prompt,
                rng.randint(1, 24 - n),
                priority=rng.randint(0, 3) if cfg.policy == "priority" else 0,
            )
        if rng.random() < 0.03 and d.tokens:
            d.abort(rng.choice(sorted(d.tokens)))
        d.step()
        for rid in list(d.tokens):  # fork some requests right after their prompt completes
            if (
                rid.startswith("r")
                and rid not in forked
                and rng.random() < 0.5
                and watch.get_num_generated(rid) == 1
                and len(d.tokens[rid]) == d.prompt_len[rid] + 1
            ):
                forked.add(rid)
                child, first = "c" + rid, rng.randrange(10, 30000)
                try:
                    if not watch.fork(rid, child, first):
                        d.tokens[child] = d.tokens[rid][:-1] + [first]
                        d.prompt_len[child] = d.prompt_len[rid]
                        d.params[child] = d.params[rid]
                except ValueError:
                    pass  # preempted and re-prefilling: not forkable
    d.run_to_end()
    assert watch.num_preemptions > 0, "trace too easy"
    assert watch.num_free_blocks == cfg.num_blocks
