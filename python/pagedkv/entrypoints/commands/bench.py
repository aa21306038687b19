"""``pagedkv bench``: offline throughput on synthetic prompts (vLLM's benchmark_throughput)."""

from __future__ import annotations

import argparse
import json
import time

from pagedkv.entrypoints.arg_types import CLIError, int_at_least
from pagedkv.entrypoints.engine_args import add_engine_arguments, build_llm

NAME = "bench"
HELP = "Measure offline throughput: N random prompts of fixed input/output lengths."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    positive = int_at_least(1)
    parser.add_argument("--num-prompts", type=positive, default=64, help="number of requests")
    parser.add_argument("--input-len", type=positive, default=128, help="prompt tokens per request")
    parser.add_argument(
        "--output-len",
        type=positive,
        default=128,
        help="generated tokens per request; EOS is ignored",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_engine_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from pagedkv.engine.sampling_params import SamplingParams

    llm = build_llm(args)
    vocab, limit = llm.llm_engine.model_config.vocab_size, llm.llm_engine.model_config.max_model_len
    if args.input_len + args.output_len > limit:
        raise CLIError(
            "--output-len",
            f"--input-len + --output-len = "
            f"{args.input_len + args.output_len} exceeds max_model_len={limit}",
        )
    rng = np.random.default_rng(args.seed)
    # Random ids (not text) give exact lengths; starting at 100 skips the special tokens that
    # most vocabularies put first.
    prompts = [
        rng.integers(100, min(vocab, 30000), args.input_len).tolist()
        for _ in range(args.num_prompts)
    ]
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=True)
    elapsed = time.perf_counter() - t0
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    result = {
        "num_prompts": args.num_prompts,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "elapsed_s": round(elapsed, 3),
        "requests_per_s": round(args.num_prompts / elapsed, 3),
        "output_tokens_per_s": round(out_tokens / elapsed, 1),
        "total_tokens_per_s": round((out_tokens + args.num_prompts * args.input_len) / elapsed, 1),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"Throughput: {result['requests_per_s']:.2f} requests/s, "
            f"{result['total_tokens_per_s']:.1f} total tokens/s, "
            f"{result['output_tokens_per_s']:.1f} output tokens/s "
            f"({args.num_prompts} prompts, {args.input_len} in / {args.output_len} out, "
            f"{elapsed:.1f} s)"
        )
    return 0
