"""``pagedkv simulate trace.jsonl``: replay a request trace through the real scheduler."""

from __future__ import annotations

import argparse
import json
import re

from pagedkv.entrypoints.arg_types import CLIError, float_in, int_at_least
from pagedkv.entrypoints.engine_args import ENGINE_FLAG, add_flag

NAME = "simulate"
HELP = (
    "Replay a JSONL trace (arrival_time, prompt_len, output_len[, prefix_group]) through "
    "the C++ scheduler with no model; report batch sizes, budget use, KV usage, "
    "preemptions and prefix hits."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("trace", help="JSONL file, one request per line")
    a("--num-blocks", type=int_at_least(1), default=2048, help="device KV-cache blocks")
    sched = parser.add_argument_group("scheduler (the engine's flags)")
    add_flag(sched, ENGINE_FLAG["block_size"], type=int_at_least(1))
    add_flag(sched, ENGINE_FLAG["max_num_seqs"])
    add_flag(sched, ENGINE_FLAG["max_num_batched_tokens"], default=2048, shown=None)
    add_flag(sched, ENGINE_FLAG["enable_chunked_prefill"])
    add_flag(sched, ENGINE_FLAG["enable_prefix_caching"])
    add_flag(sched, ENGINE_FLAG["preemption_mode"])
    add_flag(sched, ENGINE_FLAG["max_model_len"], shown="the cache capacity")
    a(
        "--num-cpu-blocks",
        type=int_at_least(0),
        default=0,
        help="host swap pool size in blocks (needed by --preemption-mode swap)",
    )
    a("--policy", choices=["fcfs", "priority"], default="fcfs", help="queue order")
    a("--step-time-ms", type=float_in(0.0), default=5.0, help="simulated fixed cost of one step")
    a("--per-token-us", type=float_in(0.0), default=20.0, help="simulated cost per scheduled token")
    a("--seed", type=int, default=0, help="seed of the fake token ids")
    a(
        "--print-every",
        type=int_at_least(0),
        default=0,
        help="print one line every N steps (0: summary only)",
    )
    a("--json", default=None, help="write summary + per-step stats to this file (default: none)")
    a(
        "--plot",
        default=None,
        help="write a PNG of KV usage and batch size to this file (default: none)",
    )


def run(args: argparse.Namespace) -> int:
    from pagedkv import SchedulerConfig
    from pagedkv.simulator import load_trace, plot, simulate

    if args.plot:
        _need_matplotlib()  # before the simulation, not after minutes of it
    try:
        config = SchedulerConfig(
            args.num_blocks,
            args.block_size,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            enable_chunked_prefill=args.enable_chunked_prefill,
            enable_prefix_caching=args.enable_prefix_caching,
            num_cpu_blocks=args.num_cpu_blocks,
            preemption_mode=args.preemption_mode,
            policy=args.policy,
            max_model_len=args.max_model_len,
        )
    except (ValueError, TypeError) as e:
        raise _flag_error(e, args) from e
    try:
        trace = load_trace(args.trace)
    except (OSError, ValueError) as e:
        raise CLIError("trace", str(e)) from e
    try:
        res = simulate(
            trace,
            config,
            step_time_ms=args.step_time_ms,
            per_token_us=args.per_token_us,
            seed=args.seed,
        )
    except ValueError as e:  # a request of the trace that this configuration cannot hold
        raise _flag_error(e, args) from e
    if args.print_every > 0:
        print(
            f"{'step':>6} {'time_s':>8} {'seqs':>5} {'pre':>4} {'tokens':>6} {'budget':>6} "
            f"{'kv':>6} {'wait':>5} {'swap':>5} {'preempt':>7}"
        )
        for s in res.steps[:: args.print_every]:
            print(
                f"{s.step:>6} {s.time:>8.3f} {s.num_seqs:>5} {s.num_prefills:>4} "
                f"{s.num_prefill_tokens + s.num_decode_tokens:>6} {s.budget_use:>6.2f} "
                f"{s.kv_usage:>6.2f} {s.num_waiting:>5} {s.num_swapped:>5} "
                f"{s.num_preempted:>7}"
            )
    for k, v in res.summary.items():
        print(f"{k:>22}: {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res.to_json(), f)
    if args.plot:
        plot(res, args.plot)
        print(f"{'plot':>22}: {args.plot}")
    return 0


def _need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CLIError(
            "--plot", "needs matplotlib, which is not installed (pip install matplotlib)"
        ) from None


def _flag_error(err: Exception, args: argparse.Namespace) -> CLIError:
    """The scheduler's checks name the field (``num_cpu_blocks must be > 0 ...``)."""
    words = [w for w in re.findall(r"[a-z_]+", str(err)) if w in vars(args)]
    return CLIError("--" + words[0].replace("_", "-") if words else None, str(err))
