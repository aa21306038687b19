"""The n-gram prompt-lookup proposer against a brute-force search over random sequences."""

from __future__ import annotations

from typing import List

import numpy as np
import pytest
from pagedkv.engine.spec_decode.ngram_proposer import NgramProposer


def _reference(seq: List[int], lo: int, hi: int, k: int) -> List[int]:
    """Longest suffix n-gram in [lo, hi] seen earlier (with a token after it); its latest such
    occurrence; the up to k tokens that followed."""
    for n in range(hi, lo - 1, -1):
        if n >= len(seq):
            continue
        suffix = seq[-n:]
        for start in range(len(seq) - n - 1, -1, -1):
            if seq[start : start + n] == suffix:
                return seq[start + n : start + n + k]
    return []


@pytest.mark.parametrize("lo, hi, k", [(1, 1, 3), (1, 4, 5), (2, 3, 1), (3, 5, 8)])
def test_matches_brute_force(lo: int, hi: int, k: int) -> None:
    rng = np.random.default_rng(lo * 100 + hi * 10 + k)
    proposer = NgramProposer(lo, hi, k)
    hits = 0
    for _ in range(300):
        seq = rng.integers(0, 4, size=int(rng.integers(0, 40))).tolist()
        want = _reference(seq, lo, hi, k)
        assert proposer.propose(seq) == want, seq
        hits += bool(want)
    assert hits > 50  # the cases exercise matches, not only misses


def test_input_grounded_continuation_and_caps() -> None:
    p = NgramProposer(prompt_lookup_min=2, prompt_lookup_max=3, num_speculative_tokens=4)
    text = [10, 11, 12, 13, 14, 15, 16, 99, 10, 11, 12]  # the output starts repeating the input
    assert p.propose(text) == [13, 14, 15, 16]
    assert p.propose(text, max_tokens=2) == [13, 14]
    assert p.propose(text, max_tokens=0) == []
    assert p.propose([1, 2, 3]) == []


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"prompt_lookup_min": 0}, "prompt_lookup_min must be a positive int"),
        ({"num_speculative_tokens": 2.0}, "num_speculative_tokens must be a positive int"),
        ({"prompt_lookup_min": 4, "prompt_lookup_max": 2}, "must not exceed"),
    ],
)
def test_bad_settings_are_refused(kw, match) -> None:
    args = {"prompt_lookup_min": 1, "prompt_lookup_max": 3, "num_speculative_tokens": 2, **kw}
    with pytest.raises(ValueError, match=match):
        NgramProposer(**args)
