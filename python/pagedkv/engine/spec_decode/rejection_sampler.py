"""Verification of k draft tokens against the target model's k+1 distributions (one sequence).

Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): draft token x_i, drawn from the
draft distribution q_i, is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first
rejection a token is drawn from the residual norm(max(p_i - q_i, 0)) and verification stops; if
all k are accepted, a bonus token is drawn from p_k. Every emitted token then follows the target
distribution p exactly, whatever q is. An n-gram proposer's q is a point mass on its draft
(``draft_probs=None``): acceptance probability p_i(x_i), residual p_i without x_i.

Greedy rows (temperature 0) accept while the draft equals the target's argmax and emit the
argmax at the first mismatch: the output is token for token that of plain greedy decoding.
``target_probs`` are the probabilities after the request's sampling knobs (temperature, top-k,
top-p, ...), so the emitted tokens follow what plain sampling would draw from.
"""

from __future__ import annotations

from typing import List, Optional

import torch


def verify_greedy(target_logits: torch.Tensor, draft_token_ids: List[int]) -> List[int]:
    """[k+1, V] target logits, k drafts -> the emitted tokens (1 to k+1)."""
    return accept_greedy(target_logits.argmax(dim=-1).tolist(), draft_token_ids)


def accept_greedy(best: List[int], draft_token_ids: List[int]) -> List[int]:
    """The target's argmax at each of the k+1 positions, k drafts -> the emitted tokens."""
    out: List[int] = []
    for i, x in enumerate(draft_token_ids):
        out.append(best[i])
        if best[i] != x:
            return out
    out.append(best[len(draft_token_ids)])
    return out


def verify_sampled(
    target_probs: torch.Tensor,
    draft_token_ids: List[int],
    draft_probs: Optional[torch.Tensor] = None,
    generator: Optional[torch.Generator] = None,
) -> List[int]:
    """[k+1, V] target probabilities, k drafts (with their [k, V] draft probabilities, or None
    for a point-mass draft) -> the emitted tokens (1 to k+1), exact in distribution."""
    k = len(draft_token_ids)
    if target_probs.dim() != 2 or target_probs.shape[0] != k + 1:
        raise ValueError(
            f"target_probs must be [k+1, vocab] = [{k + 1}, V], got {tuple(target_probs.shape)}"
        )
    if draft_probs is not None and tuple(draft_probs.shape) != (k, target_probs.shape[1]):
        raise ValueError(
            f"draft_probs must be [k, vocab] = [{k}, {target_probs.shape[1]}], "
            f"got {tuple(draft_probs.shape)}"
        )
    p = target_probs.double()
    q = (
        _draft_probs(draft_token_ids, p.shape[1], p.device)
        if draft_probs is None
        else (draft_probs.double())
    )
    idx = torch.arange(k, device=p.device)
    x = torch.tensor(draft_token_ids, dtype=torch.long, device=p.device)
    ratio = (p[idx, x] / q[idx, x]).clamp(max=1.0) if k else p.new_zeros(0)
    u = torch.rand(k, dtype=torch.float64, generator=generator, device=p.device)
    rejected = (u >= ratio).tolist()
    out: List[int] = []
    for i in range(k):
        if rejected[i]:
            residual = (p[i] - q[i]).clamp(min=0.0)
            # An all-zero residual means p == q: a rejection then has probability 0.
            out.append(_draw(residual, generator))
            return out
        out.append(draft_token_ids[i])
    out.append(_draw(p[k], generator))
    return out


def _draft_probs(draft_token_ids: List[int], vocab: int, device: torch.device) -> torch.Tensor:
    q = torch.zeros(len(draft_token_ids), vocab, dtype=torch.float64, device=device)
    if draft_token_ids:
        q[torch.arange(len(draft_token_ids)), torch.tensor(draft_token_ids)] = 1.0
    return q


def _draw(weights: torch.Tensor, generator: Optional[torch.Generator]) -> int:
    return int(torch.multinomial(weights, 1, generator=generator).item())
