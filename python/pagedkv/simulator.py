"""Scheduler simulator: replays a request trace through the real C++ scheduler with no model.

A trace is JSON Lines, one request per line::

    {"arrival_time": 0.0, "prompt_len": 512, "output_len": 128, "prefix_group": 3}

``prefix_group`` (optional) gives requests of one group a shared prompt prefix (``prefix_len``
tokens, default half the prompt) so that prefix caching has something to find; ``priority``
(optional) is passed through. Sampled tokens are fake and never stop a request early, so each
request generates exactly ``output_len`` tokens.

Time is virtual: a step costs ``step_time_ms + per_token_us * num_tokens`` (a simple linear
model of a forward pass), and requests join when the clock passes their arrival time.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Union

import numpy as np

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1  # the scheduler's priority and lengths are int32


@dataclass
class TraceRequest:
    arrival_time: float
    prompt_len: int
    output_len: int
    prefix_group: Optional[Union[int, str]] = None
    prefix_len: Optional[int] = None
    priority: int = 0


@dataclass
class StepStats:
    step: int
    time: float  # virtual seconds at the start of the step
    num_seqs: int
    num_prefills: int
    num_prefill_tokens: int
    num_decode_tokens: int
    budget_use: float  # num_tokens / max_num_batched_tokens
    kv_usage: float  # after the step
    num_running: int
    num_waiting: int
    num_swapped: int
    num_preempted: int  # preemptions during this step
    num_sampled: int  # entries that produced a token (decodes + finished prefills)
    prefix_hit_tokens: int  # cumulative


@dataclass
class SimulationResult:
    steps: list[StepStats] = field(default_factory=list)
    ttft: dict[str, float] = field(default_factory=dict)  # request id -> seconds
    latency: dict[str, float] = field(default_factory=dict)  # request id -> seconds
    summary: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"summary": self.summary, "steps": [asdict(s) for s in self.steps]}


def _int_field(rec: dict[str, Any], name: str, least: int) -> int:
    """Integer field ``name`` of ``rec``: an integral JSON number (10 or 10.0; not "10", 5.5 or
    true) in [least, int32 max] (the scheduler's ints are 32-bit)."""
    if name not in rec:
        raise ValueError(f"missing field {name!r}")
    v = rec[name]
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or (isinstance(v, float) and not (math.isfinite(v) and v.is_integer()))
    ):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    if not least <= int(v) <= _INT32_MAX:
        raise ValueError(f"{name} must be in [{least}, {_INT32_MAX}], got {v!r}")
    return int(v)


def _record(rec: Any) -> TraceRequest:
    """One trace record, every field checked (ValueError naming the field)."""
    if not isinstance(rec, dict):
        raise ValueError(f"a record must be a JSON object, got {type(rec).__name__}")
    if "arrival_time" not in rec:
        raise ValueError("missing field 'arrival_time'")
    t = rec["arrival_time"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise ValueError(f"arrival_time must be a finite number >= 0 (seconds), got {t!r}")
    group = rec.get("prefix_group")
    if group is not None and (isinstance(group, bool) or not isinstance(group, (int, str))):
        raise ValueError(f"prefix_group must be an integer or a string, got {group!r}")
    prefix_len = rec.get("prefix_len")
    return TraceRequest(
        arrival_time=float(t),
        prompt_len=_int_field(rec, "prompt_len", 1),
        output_len=_int_field(rec, "output_len", 1),
        prefix_group=group,
        prefix_len=None if prefix_len is None else _int_field(rec, "prefix_len", 0),
        priority=_int_field(rec, "priority", _INT32_MIN) if "priority" in rec else 0,
    )


def load_trace(path: Union[str, Path]) -> list[TraceRequest]:
    """Reads a JSONL trace; ValueError naming the line and the field for a bad record."""
    out: list[TraceRequest] = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(_record(json.loads(line)))
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            raise ValueError(f"{path}:{n}: bad trace record: {e}") from e
    return sorted(out, key=lambda r: r.arrival_time)


def _prompt(req: TraceRequest, rng: random.Random, vocab: int) -> list[int]:
    tokens = [rng.randrange(vocab) for _ in range(req.prompt_len)]
    if req.prefix_group is not None:
        shared = req.prefix_len if req.prefix_len is not None else req.prompt_len // 2
        shared = min(shared, req.prompt_len)
        group_rng = random.Random(f"prefix-group-{req.prefix_group}")
        tokens[:shared] = [group_rng.randrange(vocab) for _ in range(shared)]
    return tokens


def simulate(
    trace: Iterable[TraceRequest],
    config: Any,
    step_time_ms: float = 5.0,
    per_token_us: float = 20.0,
    seed: int = 0,
    vocab: int = 32000,
    max_steps: int = 1_000_000,
) -> SimulationResult:
    """Replays `trace` through ``pagedkv.Scheduler(config)``; returns per-step statistics."""
    from pagedkv import Scheduler

    reqs = sorted(trace, key=lambda r: r.arrival_time)
    sched = Scheduler(config)
    rng = random.Random(seed)
    res = SimulationResult()
    arrival: dict[str, float] = {}
    clock, nxt, step = 0.0, 0, 0
    budget = config.max_num_batched_tokens
    while nxt < len(reqs) or sched.has_unfinished_requests():
        if step >= max_steps:
            raise RuntimeError(f"simulation did not finish in {max_steps} steps")
        if not sched.has_unfinished_requests() and reqs[nxt].arrival_time > clock:
            clock = reqs[nxt].arrival_time  # idle: jump to the next arrival
        while nxt < len(reqs) and reqs[nxt].arrival_time <= clock:
            r, rid = reqs[nxt], f"req-{nxt}"
            sched.add_request(
                rid, _prompt(r, rng, vocab), r.output_len, ignore_eos=True, priority=r.priority
            )
            arrival[rid] = r.arrival_time
            nxt += 1
        preempt_before = sched.num_preemptions
        plan = sched.schedule()
        n = plan.num_seqs
        sampled = np.full(n, -1, dtype=np.int64)
        samples = plan.sample_indices >= 0
        sampled[samples] = np.asarray(
            [rng.randrange(vocab) for _ in range(int(samples.sum()))], dtype=np.int64
        )
        ids = plan.request_ids if n else []
        stats = StepStats(
            step,
            clock,
            n,
            plan.num_prefills,
            plan.num_prefill_tokens,
            plan.num_decode_tokens,
            plan.num_tokens / budget,
            0.0,
            0,
            0,
            0,
            sched.num_preemptions - preempt_before,
            int(samples.sum()),
            0,
        )
        clock += (step_time_ms * 1e-3 + per_token_us * 1e-6 * plan.num_tokens) if n else 1e-3
        for i in np.flatnonzero(samples):
            res.ttft.setdefault(ids[i], clock - arrival[ids[i]])
        for done in sched.update(plan, sampled):
            res.latency[done.request_id] = clock - arrival[done.request_id]
        stats.kv_usage = sched.kv_cache_usage
        stats.num_running, stats.num_waiting = sched.num_running, sched.num_waiting
        stats.num_swapped = sched.num_swapped
        stats.prefix_hit_tokens = sched.prefix_cache_hit_tokens
        res.steps.append(stats)
        step += 1
    res.summary = _summary(res, sched, reqs, clock)
    return res


def _summary(
    res: SimulationResult, sched: Any, reqs: list[TraceRequest], clock: float
) -> dict[str, Any]:
    busy = [s for s in res.steps if s.num_seqs]
    gen = sum(r.output_len for r in reqs)
    q = sched.prefix_cache_query_tokens
    return {
        "requests": len(reqs),
        "steps": len(res.steps),
        "sim_time_s": round(clock, 4),
        "output_tokens": gen,
        "output_tokens_per_s": round(gen / clock, 1) if clock else 0.0,
        "mean_batch_size": round(float(np.mean([s.num_seqs for s in busy])), 2) if busy else 0,
        "max_batch_size": max((s.num_seqs for s in busy), default=0),
        "mean_budget_use": round(float(np.mean([s.budget_use for s in busy])), 3) if busy else 0,
        "peak_kv_usage": round(max((s.kv_usage for s in res.steps), default=0.0), 3),
        "preemptions": sched.num_preemptions,
        "prefix_query_tokens": q,
        "prefix_hit_tokens": sched.prefix_cache_hit_tokens,
        "prefix_hit_rate": round(sched.prefix_cache_hit_tokens / q, 3) if q else 0.0,
        "mean_ttft_s": _stat(res.ttft, np.mean),
        "p99_ttft_s": _stat(res.ttft, lambda v: np.percentile(v, 99)),
        "mean_latency_s": _stat(res.latency, np.mean),
        "p99_latency_s": _stat(res.latency, lambda v: np.percentile(v, 99)),
        "leaked_blocks": sched.config.num_blocks - sched.num_free_blocks,
    }


def _stat(values: dict[str, float], fn: Any) -> float:
    return round(float(fn(list(values.values()))), 4) if values else 0.0


def plot(res: SimulationResult, path: Union[str, Path]) -> None:
    """PNG of KV-cache usage and batch size over (virtual) time, preemptions marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.time for s in res.steps]
    fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(9, 5.5))
    ax1.plot(t, [100 * s.kv_usage for s in res.steps], color="tab:blue", lw=1)
    pre = [s for s in res.steps if s.num_preempted]
    if pre:
        ax1.scatter(
            [s.time for s in pre],
            [100 * s.kv_usage for s in pre],
            color="tab:red",
            s=10,
            label="preemption",
            zorder=3,
        )
        ax1.legend(loc="lower right")
    ax1.set_ylabel("KV cache used (%)")
    ax1.set_ylim(0, 105)
    ax2.plot(t, [s.num_seqs for s in res.steps], color="tab:green", lw=1, label="batch size")
    ax2.plot(t, [s.num_waiting for s in res.steps], color="tab:orange", lw=1, label="waiting")
    ax2.set_ylabel("sequences")
    ax2.set_xlabel("simulated time (s)")
    ax2.legend(loc="upper right")
    s = res.summary
    fig.suptitle(
        f"{s.get('requests')} requests, {s.get('steps')} steps, "
        f"{s.get('preemptions')} preemptions, prefix hit rate "
        f"{s.get('prefix_hit_rate')}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
