"""top_k_top_p_threshold on the CPU against a sort-based reference with the same fixed-point
masses: exact equality over random rows (ties, zeros, peaked and flat distributions)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from support.deps import need

torch = need("torch")

from pagedkv import ops  # noqa: E402
from support.threshold_reference import threshold_ref  # noqa: E402


def _probs(r: random.Random, rows: int, vocab: int) -> np.ndarray:
    rng = np.random.default_rng(r.randrange(1 << 30))
    logits = rng.standard_normal((rows, vocab)) * r.choice([0.5, 2.0, 8.0])
    if r.random() < 0.3:  # coarse logits: many exact ties
        logits = np.round(logits)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    if r.random() < 0.3:
        probs[:, rng.integers(0, vocab, vocab // 4)] = 0.0
    return probs.astype(np.float32)


@pytest.mark.parametrize("trial", range(12))
def test_thresholds_match_the_sorted_reference(trial):
    r = random.Random()
    seed = r.randrange(1 << 30)
    r.seed(seed)
    rows, vocab = r.choice([1, 3, 7]), r.choice([2, 17, 300, 1000])
    probs = _probs(r, rows, vocab)
    top_k = np.array(
        [r.choice([0, 1, 2, 5, vocab - 1, vocab, vocab + 3]) for _ in range(rows)], dtype=np.int32
    )
    top_p = np.array(
        [r.choice([1.0, 0.9, 0.5, 0.01, 0.999]) for _ in range(rows)], dtype=np.float32
    )
    min_p = np.array([r.choice([0.0, 0.0, 0.05, 0.5]) for _ in range(rows)], dtype=np.float32)
    out = np.full(rows, np.nan, dtype=np.float32)
    ops.top_k_top_p_threshold(out, probs, top_k, top_p, min_p)
    for b in range(rows):
        want = threshold_ref(probs[b], int(top_k[b]), float(top_p[b]), float(min_p[b]))
        assert out[b] == want, (seed, b, top_k[b], top_p[b], min_p[b], out[b], want)


def test_kept_sets_are_the_textbook_ones():
    p = np.array([[0.5, 0.25, 0.125, 0.125]], dtype=np.float32)  # exact in fixed point

    def thr(k: int, tp: float, mp: float) -> float:
        out = np.zeros(1, dtype=np.float32)
        ops.top_k_top_p_threshold(
            out, p, np.array([k], np.int32), np.array([tp], np.float32), np.array([mp], np.float32)
        )
        return float(out[0])

    assert thr(0, 1.0, 0.0) == 0.0  # everything
    assert thr(1, 1.0, 0.0) == 0.5
    assert thr(2, 1.0, 0.0) == 0.25
    assert thr(3, 1.0, 0.0) == 0.125  # a tie at the k-th value keeps both
    assert thr(0, 0.5, 0.0) == 0.5  # 0.5 alone reaches p
    assert thr(0, 0.6, 0.0) == 0.25
    assert thr(0, 0.8, 0.0) == 0.125  # 0.75 before the tied pair: both kept
    assert thr(0, 1e-9, 0.0) == 0.5  # the most probable token always stays
    assert thr(0, 1.0, 0.3) == np.float32(0.15)  # min_p * max
    assert thr(2, 0.6, 0.0) == 0.5  # top-p over the top-2's mass 0.75: 0.45 is reached by 0.5


def test_torch_tensors_and_bad_arguments():
    probs = torch.softmax(torch.randn(4, 50), -1)
    out = torch.empty(4)
    args = (torch.full((4,), 5, dtype=torch.int32), torch.full((4,), 0.9), torch.zeros(4))
    ops.top_k_top_p_threshold(out, probs, *args)
    assert ((probs >= out[:, None]).sum(-1) <= 5).all()
    with pytest.raises(ValueError, match="top_p"):
        ops.top_k_top_p_threshold(out, probs, args[0], torch.zeros(4), args[2])
    with pytest.raises(TypeError, match="top_k"):
        ops.top_k_top_p_threshold(out, probs, args[0].long(), args[1], args[2])
    with pytest.raises(TypeError, match="probs"):
        ops.top_k_top_p_threshold(out, probs.double(), *args)
    with pytest.raises(ValueError, match="min_p"):
        ops.top_k_top_p_threshold(out, probs, args[0], args[1], torch.zeros(3))


def _race(probs: torch.Tensor, thresholds: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    tokens = torch.empty(len(probs), dtype=torch.int64)
    ops.sample_exponential_race(tokens, probs, thresholds, keys)
    return tokens


def test_exponential_race_draws_from_the_truncated_distribution():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(12, generator=g) * 1.5, -1)
    thr = float(p.sort(descending=True).values[6])  # keep the 7 most likely
    n = 60000
    keys = torch.randint(0, 1 << 62, (n,), generator=g)
    tokens = _race(p.expand(n, -1).contiguous(), torch.full((n,), thr), keys)
    freq = torch.bincount(tokens, minlength=12).double() / n
    want = torch.where(p >= thr, p, 0).double()
    want /= want.sum()
    assert torch.all(freq[want == 0] == 0)
    assert (freq - want).abs().max() < 0.01  # ~4 standard deviations at n = 60000


def test_exponential_race_rows_depend_only_on_their_key():
    g = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(9, 500, generator=g), -1)
    keys = torch.randint(0, 1 << 62, (9,), generator=g)
    zero = torch.zeros(9)
    batch = _race(probs, zero, keys)
    alone = torch.cat([_race(probs[i : i + 1], zero[:1], keys[i : i + 1]) for i in range(9)])
    assert torch.equal(batch, alone)
    other = _race(probs, zero, keys + 1)
    assert not torch.equal(batch, other)  # a different key, a different draw (9 rows of 500)


def test_exponential_race_edge_rows():
    probs = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.2, 0.8], [0.5, 0.5, 0.0]])
    thresholds = torch.tensor([0.0, 0.5, 0.6])  # the last row keeps nothing: token 0
    tokens = _race(probs, thresholds, torch.tensor([3, 4, 5]))
    assert tokens.tolist() == [0, 2, 0]
    with pytest.raises(TypeError, match="keys"):
        _race(probs, thresholds, torch.tensor([3, 4, 5], dtype=torch.int32))
