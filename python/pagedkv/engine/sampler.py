"""Batched token sampling over a step's logits (torch, CPU or CUDA).

Order, as vLLM defines it: allowed_token_ids mask, logit_bias, min_tokens masking ->
penalties (repetition over prompt + output, presence / frequency over output) -> greedy argmax,
or temperature -> top-k -> top-p -> min-p -> random draw. Log-probabilities returned to the
user are those of the raw model logits (vLLM V1's default), so they do not depend on the
sampling knobs.

The draw uses the exponential race (argmax of p / E with E ~ Exp(1)), which samples exactly
from p. A request with a seed has its own generator that draws a full vocabulary of noise
every step, so its tokens depend only on its seed and logits, not on who shares the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from pagedkv.engine.outputs import Logprob
from pagedkv.engine.sampling_params import SamplingParams


@dataclass
class SamplingRow:
    """One row of logits to sample from, with the state the knobs need."""

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    generator: Optional[torch.Generator] = None
    banned_token_ids: Sequence[int] = ()  # masked to -inf (EOS / stop ids before min_tokens)
    need_logprob: bool = False  # report the sampled token's logprob (cumulative_logprob)


@dataclass
class SamplerOutput:
    token_ids: List[int]
    # Per row: the sampled token's raw logprob, or None when not requested.
    sampled_logprobs: List[Optional[float]]
    # Per row: {token id: Logprob} for the sampled token and the top-`logprobs` ones, or None.
    logprobs: List[Optional[Dict[int, Logprob]]] = field(default_factory=list)


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0) -> None:
        self.device = torch.device(device)
        # Noise for unseeded requests: reproducible run to run for the same batch order.
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    def make_generator(self, seed: int) -> torch.Generator:
        g = torch.Generator(device=self.device)
        g.manual_seed(seed)
        return g

    def __call__(self, logits: torch.Tensor, rows: List[SamplingRow]) -> SamplerOutput:
        """logits: [len(rows), vocab] float32 on self.device."""
        assert logits.dim() == 2 and logits.shape[0] == len(rows)
        if not rows:
            return SamplerOutput([], [], [])
        raw = logits
        logits = logits.float()
        if any(r.banned_token_ids or _has_penalty(r.params) or r.params.logit_bias
               or r.params.allowed_token_ids is not None for r in rows):
            logits = logits.clone() if logits is raw else logits  # keep raw logits for logprobs
            _apply_allowed(logits, rows)
            _apply_logit_bias(logits, rows)
            _mask_banned(logits, rows)
            _apply_penalties(logits, rows)
        random_idx = [i for i, r in enumerate(rows) if not r.params.sampling_type_greedy]
        if not random_idx:
            tokens = logits.argmax(dim=-1)
        elif len(random_idx) == len(rows):
            tokens = self._sample_random(logits, rows)
        else:
            tokens = logits.argmax(dim=-1)
            idx = torch.tensor(random_idx, device=logits.device)
            tokens[idx] = self._sample_random(logits[idx], [rows[i] for i in random_idx])
        return _gather_logprobs(raw, tokens, rows)

    def _sample_random(self, logits: torch.Tensor, rows: List[SamplingRow]) -> torch.Tensor:
        dev = logits.device
        temps = torch.tensor([r.params.temperature for r in rows], device=dev)
        logits = logits / temps.unsqueeze(1)
        top_k = [r.params.top_k for r in rows]
        top_p = [r.params.top_p for r in rows]
        if any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p):
            logits = _top_k_top_p(logits, top_k, top_p)
        min_p = [r.params.min_p for r in rows]
        if any(m > 0.0 for m in min_p):
            probs = logits.softmax(dim=-1)
            thresh = torch.tensor(min_p, device=dev).unsqueeze(1) * probs.amax(-1, keepdim=True)
            logits = logits.masked_fill(probs < thresh, float("-inf"))
        probs = logits.softmax(dim=-1)
        noise = torch.empty_like(probs)
        unseeded = [i for i, r in enumerate(rows) if r.generator is None]
        if unseeded:
            noise.exponential_(generator=self.generator)
        for i, r in enumerate(rows):
            if r.generator is not None:
                noise[i].exponential_(generator=r.generator)
        return (probs / noise).argmax(dim=-1)

    @staticmethod
    def prompt_logprobs(logits: torch.Tensor, next_token_ids: Sequence[int],
                        num_logprobs: int) -> List[Dict[int, Logprob]]:
        """Logprob entries for prompt tokens; row j of logits predicts next_token_ids[j]."""
        if logits.shape[0] == 0:
            return []
        ids = torch.tensor(list(next_token_ids), device=logits.device)
        return _logprob_dicts(logits.float().log_softmax(-1), ids, [num_logprobs] * len(ids))


def _apply_allowed(logits: torch.Tensor, rows: List[SamplingRow]) -> None:
    """Every token outside a row's allowed_token_ids gets -inf (ids were checked against the
    vocabulary when the request came in)."""
    for i, r in enumerate(rows):
        allowed = r.params.allowed_token_ids
        if allowed is not None:
            keep = torch.tensor(allowed, dtype=torch.long, device=logits.device)
            row = torch.full_like(logits[i], float("-inf"))
            row[keep] = logits[i, keep]
            logits[i] = row


def _apply_logit_bias(logits: torch.Tensor, rows: List[SamplingRow]) -> None:
    """Adds each row's logit_bias (ids were checked against the vocabulary when the request
    came in). Before the min_tokens mask, so that a bias cannot lift a banned token."""
    for i, r in enumerate(rows):
        bias = r.params.logit_bias
        if bias:
            ids = torch.tensor(list(bias.keys()), dtype=torch.long, device=logits.device)
            values = torch.tensor(list(bias.values()), dtype=logits.dtype, device=logits.device)
            logits[i].index_add_(0, ids, values)


def _mask_banned(logits: torch.Tensor, rows: List[SamplingRow]) -> None:
    for i, r in enumerate(rows):
        if r.banned_token_ids:
            logits[i, list(r.banned_token_ids)] = float("-inf")


def _has_penalty(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def _apply_penalties(logits: torch.Tensor, rows: List[SamplingRow]) -> None:
    pick = [i for i, r in enumerate(rows) if _has_penalty(r.params)]
    if not pick:
        return
    dev, vocab = logits.device, logits.shape[1]
    idx = torch.tensor(pick, device=dev)
    sub = logits[idx]
    out_counts = _token_counts([rows[i].output_token_ids for i in pick], vocab, dev)
    prompt_counts = _token_counts([rows[i].prompt_token_ids for i in pick], vocab, dev)
    rep = torch.tensor([rows[i].params.repetition_penalty for i in pick], device=dev).unsqueeze(1)
    seen = (out_counts > 0) | (prompt_counts > 0)
    # Repetition penalty (CTRL paper, as vLLM applies it): shrink seen tokens towards zero.
    penalised = torch.where(sub > 0, sub / rep, sub * rep)
    sub = torch.where(seen, penalised, sub)
    freq = torch.tensor([rows[i].params.frequency_penalty for i in pick], device=dev)
    pres = torch.tensor([rows[i].params.presence_penalty for i in pick], device=dev)
    sub = sub - freq.unsqueeze(1) * out_counts - pres.unsqueeze(1) * (out_counts > 0).float()
    logits[idx] = sub


def _token_counts(seqs: List[Sequence[int]], vocab: int, dev: torch.device) -> torch.Tensor:
    counts = torch.zeros(len(seqs), vocab + 1, device=dev)
    width = max((len(s) for s in seqs), default=0)
    if width == 0:
        return counts[:, :vocab]
    # Pad with `vocab` (a spare column dropped below) so one scatter_add handles every row.
    padded = torch.full((len(seqs), width), vocab, dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            padded[i, :len(s)] = torch.as_tensor(list(s), dtype=torch.long)
    padded = padded.to(dev)
    counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=counts.dtype))
    return counts[:, :vocab]


def _top_k_top_p(logits: torch.Tensor, top_k: List[int], top_p: List[float]) -> torch.Tensor:
    dev, vocab = logits.device, logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    k = torch.tensor([kk if kk > 0 else vocab for kk in top_k], device=dev).unsqueeze(1)
    ranks = torch.arange(vocab, device=dev).unsqueeze(0)
    sorted_logits = sorted_logits.masked_fill(ranks >= k, float("-inf"))
    p = torch.tensor(top_p, device=dev).unsqueeze(1)
    probs = sorted_logits.softmax(dim=-1)
    # Drop a token when the mass strictly before it already reaches p (the top one always stays).
    drop = (probs.cumsum(dim=-1) - probs) > p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _gather_logprobs(raw: torch.Tensor, tokens: torch.Tensor,
                     rows: List[SamplingRow]) -> SamplerOutput:
    token_list = tokens.tolist()
    want = [i for i, r in enumerate(rows) if r.need_logprob or r.params.logprobs is not None]
    sampled_lp: List[Optional[float]] = [None] * len(rows)
    dicts: List[Optional[Dict[int, Logprob]]] = [None] * len(rows)
    if want:
        idx = torch.tensor(want, device=raw.device)
        lp = raw[idx].float().log_softmax(-1)
        ks = [rows[i].params.logprobs or 0 for i in want]
        entries = _logprob_dicts(lp, tokens[idx], ks)
        for j, i in enumerate(want):
            sampled_lp[i] = entries[j][token_list[i]].logprob
            if rows[i].params.logprobs is not None:
                dicts[i] = entries[j]
    return SamplerOutput(token_list, sampled_lp, dicts)


def _logprob_dicts(lp: torch.Tensor, chosen: torch.Tensor,
                   ks: List[int]) -> List[Dict[int, Logprob]]:
    """For each row: the chosen token's logprob and rank, plus the top-k tokens'."""
    chosen_lp = lp.gather(1, chosen.unsqueeze(1)).squeeze(1)
    ranks = (lp > chosen_lp.unsqueeze(1)).sum(dim=-1) + 1
    kmax = max(ks, default=0)
    top_lp, top_ids = (lp.topk(kmax, dim=-1) if kmax > 0 else (None, None))
    chosen_l, chosen_lp_l, ranks_l = chosen.tolist(), chosen_lp.tolist(), ranks.tolist()
    top_lp_l = top_lp.tolist() if top_lp is not None else None
    top_ids_l = top_ids.tolist() if top_ids is not None else None
    out: List[Dict[int, Logprob]] = []
    for j, k in enumerate(ks):
        d = {chosen_l[j]: Logprob(chosen_lp_l[j], ranks_l[j])}
        for r in range(k):
            tid = top_ids_l[j][r]  # type: ignore[index]
            d.setdefault(tid, Logprob(top_lp_l[j][r], r + 1))  # type: ignore[index]
        out.append(d)
    return out
