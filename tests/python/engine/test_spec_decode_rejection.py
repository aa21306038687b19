"""The speculative rejection sampler keeps the target distribution exactly (chi-square over many
draws of a toy autoregressive target with random draft models), and greedy verification emits
plain greedy's tokens."""

from __future__ import annotations

import itertools
from typing import Dict, Optional, Tuple

import numpy as np
import pytest
from support.deps import need

torch = need("torch")
stats = need("scipy.stats")

from pagedkv.engine.spec_decode.rejection_sampler import (  # noqa: E402
    verify_greedy,
    verify_sampled,
)

V, K, N = 4, 2, 5000  # vocabulary, drafts per step, draws


class ToyModel:
    """p(next | prefix) for every prefix up to K tokens: random, fixed by ``seed``."""

    def __init__(self, seed: int, concentration: float = 1.0) -> None:
        rng = np.random.default_rng(seed)
        self.table: Dict[Tuple[int, ...], np.ndarray] = {}
        for n in range(K + 1):
            for prefix in itertools.product(range(V), repeat=n):
                self.table[prefix] = rng.dirichlet([concentration] * V)

    def probs(self, prefix: Tuple[int, ...]) -> torch.Tensor:
        return torch.tensor(self.table[prefix])


def _joint(model: ToyModel) -> np.ndarray:
    """Exact P(first two tokens) under ``model``."""
    return np.array([model.table[()][a] * model.table[(a,)][b] for a in range(V) for b in range(V)])


def _speculative_pairs(target: ToyModel, draft: Optional[ToyModel], seed: int) -> np.ndarray:
    """Counts of the first two emitted tokens over N speculative steps. ``draft`` None: the
    drafts are a fixed guess (an n-gram proposer's point mass)."""
    g = torch.Generator().manual_seed(seed)
    counts = np.zeros(V * V)
    for trial in range(N):
        drafts, q_rows = [], []
        for _ in range(K):
            if draft is None:
                drafts.append((trial + len(drafts)) % V)  # any deterministic guess
            else:
                q = draft.probs(tuple(drafts))
                q_rows.append(q)
                drafts.append(int(torch.multinomial(q, 1, generator=g).item()))
        p = torch.stack([target.probs(tuple(drafts[:i])) for i in range(K + 1)])
        q_all = torch.stack(q_rows) if draft is not None else None
        out = verify_sampled(p, drafts, q_all, generator=g)
        if len(out) < 2:  # the step ended at a rejection: the next token comes from plain p
            out.append(int(torch.multinomial(target.probs((out[0],)), 1, generator=g).item()))
        counts[out[0] * V + out[1]] += 1
    return counts


@pytest.mark.parametrize("draft_seed", [None, 11, 12])
def test_sampled_tokens_follow_the_target(draft_seed: Optional[int]) -> None:
    target = ToyModel(seed=1)
    draft = None if draft_seed is None else ToyModel(draft_seed, concentration=0.5)
    counts = _speculative_pairs(target, draft, seed=100 + (draft_seed or 0))
    expected = _joint(target) * N
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    if draft is not None:
        # The test has the power to see a sampler that returned the drafts' distribution.
        assert stats.chisquare(counts, _joint(draft) * N).pvalue < 1e-6


def test_accepted_drafts_are_kept_and_impossible_ones_rejected() -> None:
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert verify_sampled(p, [1, 2]) == [1, 2, 0]  # certain drafts: all accepted + bonus
    assert verify_sampled(p, [0, 2]) == [1]  # p(0) = 0: rejected, the residual is token 1
    assert verify_sampled(p[:1], []) == [1]  # no drafts: one plain draw
    with pytest.raises(ValueError, match="target_probs must be"):
        verify_sampled(p, [1])


def test_greedy_verification_is_plain_greedy() -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        logits = torch.randn(K + 1, V, generator=g)
        drafts = torch.randint(0, V, (K,), generator=g).tolist()
        out = verify_greedy(logits, drafts)
        best = logits.argmax(-1).tolist()
        n_ok = next((i for i, x in enumerate(drafts) if x != best[i]), K)
        assert out == best[: n_ok + 1]
