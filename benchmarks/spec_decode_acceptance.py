"""N-gram speculation's acceptance on the default model with input-grounded prompts (batch 1).

Greedy speculative decoding emits exactly plain greedy's tokens, so its acceptance follows from
the plain greedy trace alone: at each verification step the proposer drafts from the context
(prompt + tokens so far), the drafts that match the greedy continuation are accepted, and the
step emits them plus one target token. This script decodes each prompt greedily with the engine,
replays that trace through NgramProposer and reports, per setting:

- acceptance rate: accepted drafts / proposed drafts;
- tokens per step: generated tokens / verification steps (plain decode: 1.0). It bounds the
  speed-up from above (a verification forward of k+1 tokens costs more than a decode step);
  the measured speed-up needs the engine path, which is not wired yet.

    python benchmarks/spec_decode_acceptance.py [--device cpu] [--max-tokens 96]
"""

from __future__ import annotations

import argparse
from typing import List, Sequence, Tuple

from pagedkv import LLM, SamplingParams
from pagedkv.engine.spec_decode.ngram_proposer import NgramProposer

TEXT = (
    "The block allocator hands out fixed-size blocks of key and value cache to sequences. "
    "When a sequence finishes, its blocks return to a free queue, and blocks whose contents are "
    "a full prefix of some prompt keep their hash so that a later request with the same prefix "
    "can reuse them without recomputing attention keys and values."
)
PROMPTS = [
    f"Repeat the following text exactly.\n\nText: {TEXT}\n\nRepeated text:",
    f"Rewrite the following text, replacing 'blocks' with 'pages'.\n\nText: {TEXT}\n\nRewritten:",
    f"Summarise the following text in two sentences.\n\nText: {TEXT}\n\nSummary:",
]
SETTINGS = [(1, 3, 2), (1, 3, 4), (2, 4, 4), (1, 5, 8)]  # (lookup min, lookup max, k)


def replay(
    prompt: Sequence[int], output: Sequence[int], proposer: NgramProposer
) -> Tuple[int, int, int]:
    """(steps, proposed, accepted) of greedy n-gram speculation reproducing ``output``."""
    steps = proposed = accepted = 0
    t = 0
    while t < len(output):
        drafts = proposer.propose(list(prompt) + list(output[:t]), max_tokens=len(output) - t - 1)
        n_ok = 0
        while n_ok < len(drafts) and drafts[n_ok] == output[t + n_ok]:
            n_ok += 1
        steps += 1
        proposed += len(drafts)
        accepted += n_ok
        t += n_ok + 1
    return steps, proposed, accepted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    llm = LLM(device=args.device, max_model_len=512)
    outs = llm.generate(
        PROMPTS, SamplingParams(temperature=0, max_tokens=args.max_tokens), use_tqdm=False
    )
    traces: List[Tuple[List[int], List[int]]] = [
        (list(o.prompt_token_ids), list(o.outputs[0].token_ids)) for o in outs
    ]
    print(f"{len(traces)} prompts, {sum(len(g) for _, g in traces)} greedy tokens")
    print(f"{'min':>3} {'max':>3} {'k':>2} | {'acceptance':>10} | {'tokens/step':>11}")
    for lo, hi, k in SETTINGS:
        proposer = NgramProposer(lo, hi, k)
        steps = proposed = accepted = generated = 0
        for prompt, output in traces:
            s, p, a = replay(prompt, output, proposer)
            steps, proposed, accepted = steps + s, proposed + p, accepted + a
            generated += len(output)
        rate = accepted / proposed if proposed else 0.0
        print(f"{lo:>3} {hi:>3} {k:>2} | {rate:>10.1%} | {generated / steps:>11.2f}")


if __name__ == "__main__":
    main()
