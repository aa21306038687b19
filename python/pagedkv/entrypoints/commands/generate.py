"""``pagedkv generate "prompt" ...``: complete one or more prompts and print the text."""

from __future__ import annotations

import argparse
import json

from pagedkv.entrypoints.arg_types import int_at_least
from pagedkv.entrypoints.engine_args import (
    add_engine_arguments,
    add_sampling_arguments,
    build_llm,
    engine_error,
    sampling_params,
)

NAME = "generate"
HELP = "Generate text for one or more prompts (default model: SmolLM2-135M-Instruct)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompts", nargs="+", help="prompt text (several prompts run batched)")
    parser.add_argument(
        "--chat",
        action="store_true",
        help="wrap each prompt as a user message in the model's chat template",
    )
    parser.add_argument("-n", type=int_at_least(1), default=1, help="completions per prompt")
    parser.add_argument("--json", action="store_true", help="print results as JSON lines")
    # Greedy by default: the same command prints the same text every time.
    add_sampling_arguments(parser, max_tokens=64, temperature=0.0)
    add_engine_arguments(parser)


def run(args: argparse.Namespace) -> int:
    params = sampling_params(args, n=args.n)
    llm = build_llm(args)
    try:
        if args.chat:
            convs = [[{"role": "user", "content": p}] for p in args.prompts]
            outs = llm.chat(convs, params, use_tqdm=False)
        else:
            outs = llm.generate(args.prompts, params, use_tqdm=False)
    except ValueError as e:  # e.g. a prompt longer than --max-model-len
        raise engine_error(e, args) from e  # type: ignore[misc]
    for prompt, out in zip(args.prompts, outs):
        for c in out.outputs:
            if args.json:
                print(
                    json.dumps(
                        {
                            "prompt": prompt,
                            "index": c.index,
                            "text": c.text,
                            "finish_reason": c.finish_reason,
                            "num_tokens": len(c.token_ids),
                        }
                    )
                )
            else:
                print(f"{prompt}{c.text}" if not args.chat else c.text)
                if len(out.outputs) > 1 or len(outs) > 1:
                    print("-" * 40)
    return 0
