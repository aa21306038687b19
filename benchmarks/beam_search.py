"""LLM.beam_search cost against plain decoding of the same lengths, and what the prefix cache
saves it.

Beam search runs each step's beams as one-token requests (engine/beam_search.py), so a step
is one engine step over prompts x beam_width requests whose full KV blocks are prefix-cache
hits; the rest of each beam's last block is recomputed. Reported: wall time of the search,
beam-tokens per second (prompts x beam_width x steps), the prefix-cache hit rate of its
requests, and a greedy generate() of the same prompts, n = beam_width samples each, EOS
ignored, as the decode baseline (the same number of sequences and tokens, decoded the usual
way). Median of --rounds after one warm-up each.

  python benchmarks/beam_search.py --device cuda --prompts 16 --max-tokens 64   # H100 / H200
  python benchmarks/beam_search.py --prompts 2 --beam-width 2 --max-tokens 8    # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Dict, List

TEXTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived",
    "List three primary colors:",
    "Write a short poem about the ocean.",
    "Explain what a CPU cache is:",
]


def _timed(fn: Any, rounds: int) -> float:
    fn()  # warm-up (CUDA graphs, allocator)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--beam-width", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None, help="write the results here too")
    args = ap.parse_args()

    from pagedkv import LLM, BeamSearchParams, SamplingParams

    llm = LLM(args.model, device=args.device, max_model_len=512)
    prompts: List[str] = [TEXTS[i % len(TEXTS)] + f" ({i})" for i in range(args.prompts)]
    width, steps = args.beam_width, args.max_tokens
    beam = BeamSearchParams(width, steps, ignore_eos=True)
    stats = llm.llm_engine.get_stats
    before = stats()
    t_beam = _timed(lambda: llm.beam_search(prompts, beam), args.rounds)
    after = stats()
    queried = after["prefix_cache_queries"] - before["prefix_cache_queries"]
    hits = after["prefix_cache_hits"] - before["prefix_cache_hits"]
    plain = SamplingParams(n=width, temperature=0, max_tokens=steps, ignore_eos=True)
    t_plain = _timed(lambda: llm.generate(prompts, plain, use_tqdm=False), args.rounds)
    tokens = args.prompts * width * steps
    result: Dict[str, Any] = {
        "device": args.device,
        "prompts": args.prompts,
        "beam_width": width,
        "max_tokens": steps,
        "beam_search_s": round(t_beam, 4),
        "beam_tokens_per_s": round(tokens / t_beam, 1),
        "plain_decode_s": round(t_plain, 4),
        "plain_tokens_per_s": round(tokens / t_plain, 1),
        "beam_vs_plain_time": round(t_beam / t_plain, 2),
        "prefix_cache_hit_rate": round(hits / queried, 3) if queried else None,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
