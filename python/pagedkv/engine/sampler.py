"""Batched token sampling over a step's logits (torch, CPU or CUDA).

Order, as vLLM defines it: allowed_token_ids mask, logit_bias, min_tokens masking ->
penalties (repetition over prompt + output, presence / frequency over output) -> greedy argmax,
or temperature -> top-k -> top-p -> min-p -> random draw. Log-probabilities returned to the
user are those of the raw model logits (vLLM V1's default), so they do not depend on the
sampling knobs; they are computed only for the rows that ask.

Every knob runs for the whole batch at once: the rows' parameters and token lists go to the
device as a few flat arrays (one copy each), and the masks, biases and penalties are scatters
over the [rows, vocab] logits, never a per-row kernel. Top-k / top-p / min-p truncate at a
per-row probability threshold found by ``pagedkv.ops.top_k_top_p_threshold`` (a radix search
over the probabilities, no vocabulary sort).

The draw is ``pagedkv.ops.sample_exponential_race``: argmax of p / E with E ~ Exp(1), which
samples exactly from p, for the whole batch in one kernel whose noise is a counter-based hash of
a per-row 64-bit key and the token id (never stored). Each row's key is one draw per step from
a host generator: the request's own (seeded: its tokens depend only on its seed and logits,
not on who shares the batch) or the sampler's (unseeded).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from pagedkv import ops
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


# Race keys are drawn in [0, 2^62): plenty of distinct streams, and a valid torch.randint range.
_KEY_RANGE = 1 << 62


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0) -> None:
        self.device = torch.device(device)
        # Keys of unseeded requests: reproducible run to run for the same batch order. Host
        # generators: a key is one host draw, never a device launch or synchronisation.
        self.generator = torch.Generator()
        self.generator.manual_seed(seed)

    def make_generator(self, seed: int) -> torch.Generator:
        """A seeded request's generator (host): one race key per step."""
        g = torch.Generator()
        g.manual_seed(seed)
        return g

    def _race_keys(self, rows: List[SamplingRow]) -> torch.Tensor:
        keys = torch.randint(0, _KEY_RANGE, (len(rows),), generator=self.generator)
        for i, r in enumerate(rows):
            if r.generator is not None:
                keys[i] = torch.randint(
                    0, _KEY_RANGE, (1,), generator=r.generator, device=r.generator.device
                ).item()
        return keys.to(self.device, non_blocking=True)

    def __call__(self, logits: torch.Tensor, rows: List[SamplingRow]) -> SamplerOutput:
        """logits: [len(rows), vocab] float32 on self.device."""
        assert logits.dim() == 2 and logits.shape[0] == len(rows)
        if not rows:
            return SamplerOutput([], [], [])
        raw = logits
        logits = self.processed_logits(logits, rows)
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

    @staticmethod
    def processed_logits(logits: torch.Tensor, rows: List[SamplingRow]) -> torch.Tensor:
        """float32 logits after the masks, biases and penalties (a copy where they change
        anything: the raw logits stay for logprobs). A greedy row takes their argmax."""
        raw = logits
        logits = logits.float()
        if any(
            r.banned_token_ids
            or _has_penalty(r.params)
            or r.params.logit_bias
            or r.params.allowed_token_ids is not None
            for r in rows
        ):
            logits = logits.clone() if logits is raw else logits
            _apply_allowed(logits, rows)
            _apply_logit_bias(logits, rows)
            _mask_banned(logits, rows)
            _apply_penalties(logits, rows)
        return logits

    @staticmethod
    def target_probs(logits: torch.Tensor, rows: List[SamplingRow]) -> torch.Tensor:
        """[rows, vocab] float32: the distribution each (random) row's draw follows, after
        every knob, normalised: what a speculative verifier must keep (the rejection sampler)."""
        probs, thresholds = Sampler._truncation(Sampler.processed_logits(logits, rows), rows)
        probs = probs.masked_fill(probs < thresholds.unsqueeze(1), 0.0)
        return probs / probs.sum(dim=-1, keepdim=True)

    def draw(self, probs: torch.Tensor, rows: List[SamplingRow]) -> torch.Tensor:
        """[rows] int64 tokens, one exact draw per row from ``probs`` (normalised, already
        truncated: a draft model's q from target_probs), keyed by the rows' generators."""
        tokens = torch.empty(len(rows), dtype=torch.int64, device=probs.device)
        zero = torch.zeros(len(rows), dtype=torch.float32, device=probs.device)
        ops.sample_exponential_race(tokens, probs.contiguous(), zero, self._race_keys(rows))
        return tokens

    @staticmethod
    def _truncation(
        logits: torch.Tensor, rows: List[SamplingRow]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Temperature softmax and the top-k / top-p / min-p thresholds (keep probs >= them)."""
        dev = logits.device
        temps = _column([r.params.temperature for r in rows], torch.float32, dev)
        probs = (logits / temps.unsqueeze(1)).softmax(dim=-1)
        # A top_k past the vocabulary is no truncation (and must fit the op's int32).
        top_k = [min(r.params.top_k, logits.shape[1]) for r in rows]
        top_p = [r.params.top_p for r in rows]
        min_p = [r.params.min_p for r in rows]
        thresholds = torch.zeros(len(rows), dtype=torch.float32, device=dev)
        if any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p) or any(min_p):
            ops.top_k_top_p_threshold(
                thresholds,
                probs,
                _column(top_k, torch.int32, dev),
                _column(top_p, torch.float32, dev),
                _column(min_p, torch.float32, dev),
            )
        return probs, thresholds

    def _sample_random(self, logits: torch.Tensor, rows: List[SamplingRow]) -> torch.Tensor:
        dev = logits.device
        probs, thresholds = self._truncation(logits, rows)
        tokens = torch.empty(len(rows), dtype=torch.int64, device=dev)
        ops.sample_exponential_race(tokens, probs, thresholds, self._race_keys(rows))
        return tokens

    @staticmethod
    def prompt_logprobs(
        logits: torch.Tensor, next_token_ids: Sequence[int], num_logprobs: int
    ) -> List[Dict[int, Logprob]]:
        """Logprob entries for prompt tokens; row j of logits predicts next_token_ids[j]."""
        if logits.shape[0] == 0:
            return []
        ids = torch.tensor(list(next_token_ids), device=logits.device)
        return _logprob_dicts(logits.float().log_softmax(-1), ids, [num_logprobs] * len(ids))


def _column(values: Sequence[float], dtype: torch.dtype, dev: torch.device) -> torch.Tensor:
    """One per-row parameter as a device array (one host-to-device copy)."""
    return torch.tensor(values, dtype=dtype).to(dev, non_blocking=True)


def _flat(lists: Sequence[Sequence[int]], dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(row index, token id) of every entry of the rows' token lists, as two device arrays built
    on the host in one pass (no per-row device work)."""
    lengths = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
    ids = np.fromiter(
        itertools.chain.from_iterable(lists), dtype=np.int64, count=int(lengths.sum())
    )
    pairs = torch.from_numpy(np.stack([np.repeat(np.arange(len(lists)), lengths), ids]))
    pairs = pairs.to(dev, non_blocking=True)
    return pairs[0], pairs[1]


def _apply_allowed(logits: torch.Tensor, rows: List[SamplingRow]) -> None:
    """Every token outside a row's allowed_token_ids gets -inf (ids were checked against the
    vocabulary when the request came in)."""
    pick = [i for i, r in enumerate(rows) if r.params.allowed_token_ids is not None]
    if not pick:
        return
    dev = logits.device
    r, ids = _flat([rows[i].params.allowed_token_ids for i in pick], dev)  # type: ignore[misc]
    keep = torch.zeros(len(pick), logits.shape[1], dtype=torch.bool, device=dev)
    keep[r, ids] = True
    idx = torch.tensor(pick, device=dev)
    logits[idx] = logits[idx].masked_fill(~keep, float("-inf"))


def _apply_logit_bias(logits: torch.Tensor, rows: List[SamplingRow]) -> None:
    """Adds each row's logit_bias (ids were checked against the vocabulary when the request
    came in). Before the min_tokens mask, so that a bias cannot lift a banned token."""
    pick = [i for i, r in enumerate(rows) if r.params.logit_bias]
    if not pick:
        return
    biases = [rows[i].params.logit_bias for i in pick]
    r, ids = _flat([list(b.keys()) for b in biases], logits.device)  # type: ignore[union-attr]
    values = torch.tensor(
        [v for b in biases for v in b.values()],  # type: ignore[union-attr]
        dtype=logits.dtype,
    ).to(logits.device, non_blocking=True)
    rows_idx = torch.tensor(pick, device=logits.device)[r]
    logits.index_put_((rows_idx, ids), values, accumulate=True)


def _mask_banned(logits: torch.Tensor, rows: List[SamplingRow]) -> None:
    if not any(r.banned_token_ids for r in rows):
        return
    r, ids = _flat([r.banned_token_ids for r in rows], logits.device)
    logits.index_put_((r, ids), torch.tensor(float("-inf"), device=logits.device))


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
    params = torch.tensor(
        [
            [
                rows[i].params.repetition_penalty,
                rows[i].params.frequency_penalty,
                rows[i].params.presence_penalty,
            ]
            for i in pick
        ]
    ).to(dev)
    rep, freq, pres = params[:, 0:1], params[:, 1:2], params[:, 2:3]
    seen = (out_counts > 0) | (prompt_counts > 0)
    # Repetition penalty (CTRL paper, as vLLM applies it): shrink seen tokens towards zero.
    penalised = torch.where(sub > 0, sub / rep, sub * rep)
    sub = torch.where(seen, penalised, sub)
    sub = sub - freq * out_counts - pres * (out_counts > 0).float()
    logits[idx] = sub


def _token_counts(seqs: List[Sequence[int]], vocab: int, dev: torch.device) -> torch.Tensor:
    """[len(seqs), vocab] float32 occurrence counts, one scatter-add for all rows."""
    counts = torch.zeros(len(seqs), vocab, device=dev)
    r, ids = _flat(seqs, dev)
    if len(ids):
        counts.index_put_((r, ids), torch.ones(len(ids), device=dev), accumulate=True)
    return counts


def _gather_logprobs(
    raw: torch.Tensor, tokens: torch.Tensor, rows: List[SamplingRow]
) -> SamplerOutput:
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


def _logprob_dicts(
    lp: torch.Tensor, chosen: torch.Tensor, ks: List[int]
) -> List[Dict[int, Logprob]]:
    """For each row: the chosen token's logprob and rank, plus the top-k tokens'."""
    chosen_lp = lp.gather(1, chosen.unsqueeze(1)).squeeze(1)
    ranks = (lp > chosen_lp.unsqueeze(1)).sum(dim=-1) + 1
    kmax = max(ks, default=0)
    top_lp, top_ids = lp.topk(kmax, dim=-1) if kmax > 0 else (None, None)
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
