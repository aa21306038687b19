"""``pagedkv simulate trace.jsonl``: replay a request trace through the real scheduler."""

from __future__ import annotations

import argparse
import json

NAME = "simulate"
HELP = ("Replay a JSONL trace (arrival_time, prompt_len, output_len[, prefix_group]) through "
        "the C++ scheduler with no model; report batch sizes, budget use, KV usage, "
        "preemptions and prefix hits.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", help="JSONL file, one request per line")
    parser.add_argument("--num-blocks", type=int, default=2048, help="device KV-cache blocks")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block")
    parser.add_argument("--max-num-seqs", type=int, default=256, help="sequences per step")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048,
                        help="token budget per step")
    parser.add_argument("--no-chunked-prefill", action="store_true",
                        help="disable chunked prefill (prompts must fit one step)")
    parser.add_argument("--no-prefix-caching", action="store_true",
                        help="disable automatic prefix caching")
    parser.add_argument("--preemption-mode", choices=["recompute", "swap"], default="recompute",
                        help="what happens to a preempted sequence's blocks")
    parser.add_argument("--num-cpu-blocks", type=int, default=0,
                        help="host swap pool size (needed by --preemption-mode swap)")
    parser.add_argument("--policy", choices=["fcfs", "priority"], default="fcfs",
                        help="queue order")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="longest prompt + output (default: the cache capacity)")
    parser.add_argument("--step-time-ms", type=float, default=5.0,
                        help="simulated fixed cost of one step")
    parser.add_argument("--per-token-us", type=float, default=20.0,
                        help="simulated cost per scheduled token")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fake token ids")
    parser.add_argument("--print-every", type=int, default=0,
                        help="print one line every N steps (0: summary only)")
    parser.add_argument("--json", default=None, help="write summary + per-step stats here")
    parser.add_argument("--plot", default=None, help="write a PNG of KV usage and batch size")


def run(args: argparse.Namespace) -> int:
    from pagedkv import SchedulerConfig
    from pagedkv.simulator import load_trace, plot, simulate

    config = SchedulerConfig(
        args.num_blocks, args.block_size, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_chunked_prefill=not args.no_chunked_prefill,
        enable_prefix_caching=not args.no_prefix_caching, num_cpu_blocks=args.num_cpu_blocks,
        preemption_mode=args.preemption_mode, policy=args.policy,
        max_model_len=args.max_model_len)
    res = simulate(load_trace(args.trace), config, step_time_ms=args.step_time_ms,
                   per_token_us=args.per_token_us, seed=args.seed)
    if args.print_every > 0:
        print(f"{'step':>6} {'time_s':>8} {'seqs':>5} {'pre':>4} {'tokens':>6} {'budget':>6} "
              f"{'kv':>6} {'wait':>5} {'swap':>5} {'preempt':>7}")
        for s in res.steps[:: args.print_every]:
            print(f"{s.step:>6} {s.time:>8.3f} {s.num_seqs:>5} {s.num_prefills:>4} "
                  f"{s.num_prefill_tokens + s.num_decode_tokens:>6} {s.budget_use:>6.2f} "
                  f"{s.kv_usage:>6.2f} {s.num_waiting:>5} {s.num_swapped:>5} "
                  f"{s.num_preempted:>7}")
    for k, v in res.summary.items():
        print(f"{k:>22}: {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res.to_json(), f)
    if args.plot:
        plot(res, args.plot)
        print(f"{'plot':>22}: {args.plot}")
    return 0
