"""The engine on one shared system prompt (issue #32): 64 requests = the same ~8k-token system
prompt + a short user turn of their own (8-40 tokens), greedy, 128-256 new tokens each, with the
cascade on (the prefix cache shares the prompt's blocks, decode steps run the cascade: the CUDA
graphs' cascade variant, cascade_cuda_graphs=True, or eager steps with --eager) and off
(disable_cascade_attn=True). Prints output tokens/s, the median decode step (ms), how many decode
steps ran the cascade, and whether the tokens agree (bf16: near-ties may flip after the first
divergence).

    python benchmarks/cascade_engine.py [--requests 64] [--prefix 8192] [--eager] [--json f]
    python benchmarks/cascade_engine.py --device cpu --requests 8 --prefix 256 --min-new 4 \
        --max-new 8 --layers 1      # smoke run (float32, eager)

A random-weight model of Llama-8B's attention shape (32 query heads, 8 KV heads, head size 128)
with few layers and a small MLP, so the decode's attention dominates, as it does at 8k contexts
(--layers, default 4).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import torch
from pagedkv.engine.llm import LLM
from pagedkv.engine.sampling_params import SamplingParams
from pagedkv.testing import save_random_model


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run(
    model_dir: str, prompts: list, news: list, disable: bool, eager: bool, device: str
) -> dict[str, Any]:
    cuda = device == "cuda"
    llm = LLM(
        model_dir,
        skip_tokenizer_init=True,
        seed=0,
        device=device,
        dtype="bfloat16" if cuda else "float32",
        enforce_eager=eager or not cuda,
        max_model_len=max(len(p) for p in prompts) + max(news) + 16,
        max_seq_len_to_capture=max(len(p) for p in prompts) + max(news) + 16,
        max_num_seqs=len(prompts),
        **({"gpu_memory_utilization": 0.6} if cuda else {"kv_cache_space": 1.0}),
        disable_cascade_attn=disable,
        cascade_cuda_graphs=cuda and not (eager or disable),
    )
    eng = llm.llm_engine
    # The prompt once first, so the prefix cache holds its blocks for every request.
    llm.generate([prompts[0]], SamplingParams(max_tokens=1), use_tqdm=False)
    for i, (p, n) in enumerate(zip(prompts, news)):
        eng.add_request(str(i), p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    steps, tokens = [], {}
    _sync(device)
    t0 = time.perf_counter()
    while eng.has_unfinished_requests():
        s0 = time.perf_counter()
        for out in eng.step():
            if out.finished:
                tokens[int(out.request_id)] = list(out.outputs[0].token_ids)
        steps.append(time.perf_counter() - s0)
    secs = time.perf_counter() - t0
    runner = eng.runner
    plans, graphs = runner.step_plans, runner.graphs
    res = {
        "tok_s": sum(news) / secs,
        # Decode-only steps: all but the first (the user turns' prefill).
        "step_ms": 1e3 * statistics.median(steps[1:]),
        "steps": len(steps),
        "cascade_eager_layers": 0 if plans is None else plans.cascade_layers,
        "cascade_replays": 0 if graphs is None else graphs.cascade_replays,
        "graph_replays": 0 if graphs is None else graphs.num_replays,
        "tokens": [tokens[i] for i in range(len(prompts))],
    }
    del llm, eng, runner, plans, graphs
    if cuda:
        torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prefix", type=int, default=8192)
    ap.add_argument("--min-new", type=int, default=128)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs (enforce_eager)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--json", help="also write the figures here")
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
        num_hidden_layers=args.layers,
        vocab_size=4096,
        max_position_embeddings=args.prefix + args.max_new + 1024,
    )
    rng = np.random.default_rng(0)
    system = rng.integers(5, 4000, args.prefix).tolist()
    prompts = [
        system + rng.integers(5, 4000, int(rng.integers(8, 41))).tolist()
        for _ in range(args.requests)
    ]
    news = rng.integers(args.min_new, args.max_new + 1, args.requests).tolist()
    res = {
        name: run(model_dir, prompts, news, disable, args.eager, args.device)
        for name, disable in (("off", True), ("on", False))
    }
    on, off = res["on"], res["off"]
    agree = np.mean([x == y for a, b in zip(on["tokens"], off["tokens"]) for x, y in zip(a, b)])
    eager = args.eager or args.device != "cuda"
    mode = "eager" if eager else "CUDA graphs"
    print(
        f"{args.requests} requests x ({args.prefix} shared + 8-40 own) prompt tokens, "
        f"{args.min_new}-{args.max_new} new, {args.layers} layers, {mode}:"
    )
    print(f"{'cascade':>8} {'tok/s':>9} {'step ms':>8} {'steps':>6} {'cascade steps':>14}")
    for name in ("off", "on"):
        r = res[name]
        ran = r["cascade_replays"] if not eager else r["cascade_eager_layers"] // args.layers
        print(f"{name:>8} {r['tok_s']:9.0f} {r['step_ms']:8.2f} {r['steps']:6d} {ran:14d}")
    print(
        f"cascade on / off: {on['tok_s'] / off['tok_s']:.2f}x tok/s, decode step "
        f"{off['step_ms'] / on['step_ms']:.2f}x faster; tokens agree {agree:.3f}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({k: {x: y for x, y in v.items() if x != "tokens"} for k, v in res.items()}, f)


if __name__ == "__main__":
    main()
