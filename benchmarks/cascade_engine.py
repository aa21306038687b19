"""The engine on one shared system prompt: 64 requests = the same 8192-token prefix + 16 tokens
of their own, greedy, 64 new tokens each, eager decode steps (the cascade runs on eager steps:
engine/decode_plans.py). Prints decode tokens/s with the decode plans on ("auto": the cascade
once the prefix cache shares the prompt's blocks) and off ("partition"), and whether the tokens
agree.

    python benchmarks/cascade_engine.py [--requests 64] [--prefix 8192] [--new 64]

A random-weight model of Llama-8B's attention shape (32 query heads, 8 KV heads, head size 128)
with two layers and a small MLP, so the decode's attention dominates, as it does at 8k contexts.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch
from pagedkv.engine.llm import LLM
from pagedkv.engine.sampling_params import SamplingParams
from pagedkv.testing import save_random_model


def run(model_dir: str, prompts: list, new: int, schedule: str) -> tuple[float, list, int]:
    llm = LLM(
        model_dir,
        skip_tokenizer_init=True,
        seed=0,
        dtype="bfloat16",
        enforce_eager=True,
        max_model_len=len(prompts[0]) + new + 16,
        max_num_seqs=len(prompts),
        gpu_memory_utilization=0.5,
    )
    plans = llm.llm_engine.runner.step_plans
    if plans is None:
        raise SystemExit("no decode plans: the decode does not run on the Hopper kernel here")
    plans.schedule = schedule
    # The prompt once first, so the prefix cache holds its blocks for every request.
    llm.generate([prompts[0]], SamplingParams(max_tokens=1), use_tqdm=False)
    params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    return len(prompts) * new / secs, [o.outputs[0].token_ids for o in outs], plans.cascade_layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prefix", type=int, default=8192)
    ap.add_argument("--new", type=int, default=64)
    args = ap.parse_args()
    model_dir = save_random_model(
        tempfile.mkdtemp(),
        "tiny-llama",
        tokenizer=False,
        hidden_size=1024,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=1024,
        num_hidden_layers=2,
        vocab_size=4096,
        max_position_embeddings=args.prefix + 1024,
    )
    rng = np.random.default_rng(0)
    system = rng.integers(5, 4000, args.prefix).tolist()
    prompts = [system + rng.integers(5, 4000, 16).tolist() for _ in range(args.requests)]
    res = {s: run(model_dir, prompts, args.new, s) for s in ("partition", "auto")}
    agree = np.mean(
        [x == y for a, b in zip(res["auto"][1], res["partition"][1]) for x, y in zip(a, b)]
    )
    print(
        f"{args.requests} requests x ({args.prefix} shared + 16 own) prompt tokens, "
        f"{args.new} new: "
        f"cascade (auto) {res['auto'][0]:.0f} tok/s ({res['auto'][2]} cascade layer calls), "
        f"plain (partition) {res['partition'][0]:.0f} tok/s, "
        f"{res['auto'][0] / res['partition'][0]:.2f}x; tokens agree {agree:.3f} (bf16 near-ties)"
    )


if __name__ == "__main__":
    main()
