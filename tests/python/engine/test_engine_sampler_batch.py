"""Sampler on mixed batches: every row must be sampled with its own temperature / top-k / top-p /
min-p, whatever the other rows ask for.

test_engine_sampler.py checks each knob with batches whose rows all share one SamplingParams;
mutation testing found that taking row 0's temperature, top-k, top-p or min-p for the whole
batch passed it, as did applying min-p before the temperature (its min-p case has t = 1) and a
min-p that masks the most likely token itself when min_p = 1.
"""

from __future__ import annotations

import numpy as np
from support.deps import need

torch = need("torch")

from pagedkv.engine.sampler import Sampler, SamplingRow  # noqa: E402
from pagedkv.engine.sampling_params import SamplingParams  # noqa: E402


def _expected(logits: np.ndarray, t: float, k: int, p: float, min_p: float) -> np.ndarray:
    """Float64 distribution after temperature, then top-k, then top-p over the survivors
    (a token stays while the mass of the tokens ranked above it is <= p), then min-p."""
    z = logits / t
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    keep = np.zeros(len(z), bool)
    keep[order[:k] if k > 0 else order] = True
    q = np.where(keep, probs, 0.0)
    q /= q.sum()
    above = 0.0
    for tok in order:
        if not keep[tok]:
            break
        if above > p:
            keep[tok] = False
        above += q[tok]
    q = np.where(keep, probs, 0.0)
    q /= q.sum()
    if min_p > 0:
        q = np.where(q >= min_p * q.max(), q, 0.0)
        q /= q.sum()
    return q


# (temperature, top_k, top_p, min_p): each differs from the others in the knob it exercises.
CONFIGS = [
    (0.5, 0, 1.0, 0.0),
    (2.0, 0, 1.0, 0.0),
    (1.0, 3, 1.0, 0.0),
    (1.0, 0, 0.5, 0.0),
    (1.5, 0, 1.0, 0.1),
    (1.0, 8, 0.9, 0.0),
]


def test_each_row_uses_its_own_knobs_in_a_mixed_batch() -> None:
    torch.manual_seed(5)
    vocab, per_config = 12, 6000
    logits = torch.randn(vocab, dtype=torch.float64) * 1.5
    params = [SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m) for t, k, p, m in CONFIGS]
    # Interleave the configurations row by row, so no configuration owns row 0 alone.
    rows = [SamplingRow(params[i % len(params)], [], []) for i in range(per_config * len(params))]
    batch = logits.float().expand(len(rows), -1).contiguous()
    toks = np.asarray(Sampler(torch.device("cpu"), seed=11)(batch, rows).token_ids)
    for c, (t, k, p, m) in enumerate(CONFIGS):
        want = _expected(logits.numpy(), t, k, p, m)
        freq = np.bincount(toks[c :: len(CONFIGS)], minlength=vocab) / per_config
        assert np.all(freq[want == 0] == 0), (CONFIGS[c], freq, want)  # truncated: never drawn
        # 6000 draws: the standard error of a frequency is <= 0.0065; 0.03 is > 4.5 of them.
        assert np.abs(freq - want).max() < 0.03, (CONFIGS[c], freq, want)


def test_greedy_and_random_rows_mixed() -> None:
    torch.manual_seed(6)
    logits = torch.randn(6, 50)
    rows = [
        SamplingRow(SamplingParams(temperature=0 if i % 2 else 1.0, top_k=1), [], [])
        for i in range(6)
    ]
    # top_k = 1 makes the random rows deterministic too: every row must give its own argmax.
    out = Sampler(torch.device("cpu"), seed=1)(logits, rows).token_ids
    assert out == logits.argmax(-1).tolist()


def test_min_p_one_keeps_only_the_most_likely_token() -> None:
    torch.manual_seed(7)
    logits = torch.randn(64, 30)
    rows = [SamplingRow(SamplingParams(temperature=1.3, min_p=1.0), [], []) for _ in range(64)]
    out = Sampler(torch.device("cpu"), seed=2)(logits, rows).token_ids
    assert out == logits.argmax(-1).tolist()


def test_min_p_applies_to_the_tempered_distribution() -> None:
    # Two tokens with probabilities 0.8 / 0.2 at t = 1: min_p = 0.3 drops the second. At t = 3
    # they are 0.61 / 0.39 (ratio 0.63 > 0.3): both stay, and the second is drawn ~39 % of the time.
    lo = float(np.log(0.2 / 0.8))
    logits = torch.tensor([[0.0, lo] + [-1e4] * 6])
    rows = [SamplingRow(SamplingParams(temperature=3.0, min_p=0.3), [], []) for _ in range(4000)]
    toks = np.asarray(
        Sampler(torch.device("cpu"), seed=3)(logits.expand(4000, -1).contiguous(), rows).token_ids
    )
    share = float((toks == 1).mean())
    p1 = 1.0 / (1.0 + np.exp(-lo / 3.0))  # softmax of (0, lo / 3), second entry
    assert abs(share - p1) < 0.04, (share, p1)
    assert set(toks.tolist()) <= {0, 1}
