"""The engine's speculative-decoding step: propose drafts, verify them after the target forward.

Between steps, ``propose`` gives every decoding sequence that can speculate up to k drafts
(``Scheduler.set_draft_tokens``): n-gram drafts, or, with a draft model, placeholders whose
slots the next schedule() reserves and which ``draft`` fills in by running the draft model
before the target's forward (draft_model.py). The scheduler feeds each such sequence's last
token and its drafts as one k+1-token query through the extend path. After the forward,
``verify`` turns the k+1 hidden rows of every speculating entry into logits and runs the
rejection sampler: greedy rows accept while the draft is the argmax (output identical to plain
greedy decoding), random rows keep the target distribution exactly. The engine passes the
emitted tokens to ``Scheduler.update_accepted``, which rolls back the rejected drafts' slots.

Each of the k+1 rows is the distribution the plain sampler would use at that position: the
knobs that depend on the output so far (penalties, min_tokens bans, bad words) see the output
extended by the drafts before that row. Requests whose sampling needs more than one
distribution per step are served without drafts (they decode one token a step, as before):
logprobs (per-token and best_of > n rankings), structured outputs, logits processors. This only
changes speed, never what is generated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import numpy as np
import torch

from pagedkv.engine.request_failures import FAILED, RequestFailures, try_batch
from pagedkv.engine.request_state import RequestState, SeqState
from pagedkv.engine.sampler import Sampler, SamplingRow
from pagedkv.engine.spec_decode.config import NGRAM, SpeculativeConfig
from pagedkv.engine.spec_decode.draft_model import DraftModelProposer
from pagedkv.engine.spec_decode.ngram_proposer import NgramProposer
from pagedkv.engine.spec_decode.rejection_sampler import accept_greedy, verify_sampled

Entry = Tuple[RequestState, SeqState]
# A plan entry's sequence; None for an entry dropped since the plan was scheduled.
MaybeEntry = Optional[Entry]


@dataclass
class SpecDecodeMetrics:
    """vLLM's spec_decode counters: drafts (sequences that speculated in a step), the draft
    tokens fed, and how many of them were accepted."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    def as_stats(self) -> Dict[str, int]:
        return {
            "spec_decode_num_drafts": self.num_drafts,
            "spec_decode_num_draft_tokens": self.num_draft_tokens,
            "spec_decode_num_accepted_tokens": self.num_accepted_tokens,
        }


def can_speculate(req: RequestState, seq: SeqState) -> bool:
    """The request's next tokens can be verified from one distribution per position."""
    p = req.params
    return (
        not seq.finished
        and seq.matcher is None
        and p.logprobs is None
        and not p.logits_processors
        and (p.best_of or p.n) == p.n
        and (req.forked or len(req.seqs) == 1)
    )


class Speculator:
    def __init__(
        self,
        config: SpeculativeConfig,
        sampler: Sampler,
        draft_runner: Any = None,
    ) -> None:
        """``draft_runner``: the draft model's ModelRunner (method draft_model)."""
        self.config = config
        self.sampler = sampler
        self.ngram: Optional[NgramProposer] = None
        self.drafter: Optional[DraftModelProposer] = None
        if config.method == NGRAM:
            self.ngram = NgramProposer(
                config.prompt_lookup_min, config.prompt_lookup_max, config.num_speculative_tokens
            )
        else:
            assert draft_runner is not None, "a draft model needs its runner"
            self.drafter = DraftModelProposer(draft_runner, sampler, config.num_speculative_tokens)
        self.metrics = SpecDecodeMetrics()

    # ------------------------------------------------------------------ before a step
    def propose(self, scheduler: Any, entries: Iterable[MaybeEntry]) -> None:
        """Drafts for the sequences that just got a token and still run (the next step decodes
        them). A sequence left without drafts decodes one token, as without speculation."""
        if self.drafter is not None:
            self.drafter.reserve(scheduler, _speculating(entries))
            return
        assert self.ngram is not None
        for (req, seq), room in _speculating(entries):
            drafts = self.ngram.propose(req.prompt_token_ids + seq.token_ids, room)
            if drafts:
                scheduler.set_draft_tokens(seq.sched_id, drafts)

    def draft(self, plan: Any, entries: List[MaybeEntry], live: Mapping[str, Any]) -> None:
        """Before the target's forward: the draft model's drafts into the plan (n-gram drafts
        are in it already). ``live``: the engine's sequences by scheduler id."""
        if self.drafter is not None:
            self.drafter.propose(plan, entries, live, sampling_row)

    # ------------------------------------------------------------------ after the forward
    def verify(
        self,
        plan: Any,
        hidden: torch.Tensor,
        entries: List[MaybeEntry],
        compute_logits: Any,
        failures: RequestFailures,
    ) -> Dict[int, List[int]]:
        """Plan entry index -> the tokens it emits (1 to k+1), for every speculating entry.
        ``failures``: where a request whose own knobs raise is blamed (the batched knobs are
        then redone entry by entry); its entry emits nothing here (the caller aborts it)."""
        n = len(entries)
        num_draft = np.asarray(plan.num_draft_tokens[:n])
        spec = [i for i in np.flatnonzero(num_draft > 0).tolist() if entries[i] is not None]
        if not spec:
            return {}
        qsl = np.asarray(plan.query_start_loc[: n + 1])
        input_ids = np.asarray(plan.input_ids[: int(plan.num_tokens)])
        rows: List[int] = []
        for i in spec:
            rows.extend(range(int(qsl[i + 1] - num_draft[i] - 1), int(qsl[i + 1])))
        picked = torch.tensor(rows, dtype=torch.long, device=hidden.device)
        logits = compute_logits(hidden, picked)
        # Per speculating entry: its rows of `logits`, drafts, and (unless a plain argmax)
        # the sampling row of each position. Knob-processed in two batches: greedy, random.
        spans: List[Tuple[int, int, List[int]]] = []
        greedy: List[int] = []
        random: List[int] = []
        knob_rows: Dict[int, SamplingRow] = {}
        at = 0
        for i in spec:
            k = int(num_draft[i])
            drafts = input_ids[qsl[i + 1] - k : qsl[i + 1]].tolist()
            spans.append((i, at, drafts))
            req, seq = _live(entries[i])
            if not req.argmax_row(seq):  # plain greedy, nothing banned now (nor later)
                for j in range(k + 1):
                    knob_rows[at + j] = sampling_row(req, seq, drafts[:j])
                (greedy if req.params.sampling_type_greedy else random).extend(
                    range(at, at + k + 1)
                )
            at += k + 1
        target = logits
        if greedy or random:
            target = logits.float().clone()
        probs: Dict[int, torch.Tensor] = {}

        knobs = lambda: _apply_knobs(logits, target, probs, greedy, random, knob_rows)  # noqa: E731
        if try_batch(knobs) is FAILED:
            spans = self._knobs_each(logits, target, probs, spans, entries, knob_rows, failures)
        best = target.argmax(dim=-1).tolist()  # one device sync for every greedy row
        out: Dict[int, List[int]] = {}
        for i, start, drafts in spans:
            k = len(drafts)
            req, seq = _live(entries[i])
            if start in probs:
                gen = seq.generator if seq.generator is not None else self.sampler.generator
                p_rows = torch.stack([probs[start + j] for j in range(k + 1)])
                q = self.drafter.draft_probs.get(i) if self.drafter is not None else None
                out[i] = verify_sampled(p_rows, drafts, q, gen)
            else:
                out[i] = accept_greedy(best[start : start + k + 1], drafts)
            if self.drafter is not None:
                self.drafter.accepted(i, len(out[i]) - 1)
            self.metrics.num_drafts += 1
            self.metrics.num_draft_tokens += k
            self.metrics.num_accepted_tokens += len(out[i]) - 1
        return out

    @staticmethod
    def _knobs_each(
        logits: torch.Tensor,
        target: torch.Tensor,
        probs: Dict[int, torch.Tensor],
        spans: List[Tuple[int, int, List[int]]],
        entries: List[MaybeEntry],
        knob_rows: Dict[int, SamplingRow],
        failures: RequestFailures,
    ) -> List[Tuple[int, int, List[int]]]:
        """The knobs entry by entry, after the batch raised: the spans whose own knobs worked
        (the request of one that raised is blamed, as StepSampling retries its sampler)."""
        kept = []
        for span in spans:
            i, start, drafts = span
            own = [r for r in range(start, start + len(drafts) + 1) if r in knob_rows]
            req, seq = _live(entries[i])
            greedy = own if own and req.params.sampling_type_greedy else []
            random = own if own and not req.params.sampling_type_greedy else []
            with failures.guard(req):
                _apply_knobs(logits, target, probs, greedy, random, knob_rows)
                kept.append(span)
        return kept


def _apply_knobs(
    logits: torch.Tensor,
    target: torch.Tensor,
    probs: Dict[int, torch.Tensor],
    greedy: List[int],
    random: List[int],
    knob_rows: Dict[int, SamplingRow],
) -> None:
    """The knobs of the ``greedy`` rows into ``target`` (processed logits), the distributions
    of the ``random`` rows into ``probs`` (on the host): what verification compares."""
    if greedy:
        idx = torch.tensor(greedy, device=logits.device)
        target[idx] = Sampler.processed_logits(logits[idx], [knob_rows[r] for r in greedy])
    if random:
        idx = torch.tensor(random, device=logits.device)
        p = Sampler.target_probs(logits[idx], [knob_rows[r] for r in random]).cpu()
        probs.update((r, p[j]) for j, r in enumerate(random))


def sampling_row(req: RequestState, seq: SeqState, accepted: List[int]) -> SamplingRow:
    """The sampling row of ``seq`` at the position after ``accepted`` more drafts."""
    out = seq.token_ids + accepted if accepted else seq.token_ids
    ahead = SeqState(index=seq.index, token_ids=out)
    return SamplingRow(
        req.params, req.prompt_token_ids, out, seq.generator, req.banned_tokens(ahead)
    )


def _speculating(entries: Iterable[MaybeEntry]) -> Iterable[Tuple[Entry, int]]:
    """The entries' sequences that may speculate next step, each with its room for drafts."""
    for entry in entries:
        if entry is None:
            continue
        req, seq = entry
        if seq.sched_id is None or not seq.token_ids or not can_speculate(req, seq):
            continue
        room = req.max_tokens - len(seq.token_ids) - 1  # the last token is never a draft
        if room > 0:
            yield entry, room


def _live(entry: MaybeEntry) -> Entry:
    assert entry is not None
    return entry


def emitted_arrays(
    sampled: np.ndarray, spec: Dict[int, List[int]]
) -> Tuple[np.ndarray, np.ndarray]:
    """(token_ids, num_accepted) for Scheduler.update_accepted: the speculating entries' emitted
    tokens, one sampled token for every other sampling entry, nothing for a partial chunk."""
    n = len(sampled)
    counts = np.zeros(n, dtype=np.int32)
    tokens: List[int] = []
    for i, tok in enumerate(sampled.tolist()):
        got: Optional[List[int]] = spec.get(i)
        if got is None:
            got = [tok] if tok >= 0 else []
        tokens.extend(got)
        counts[i] = len(got)
    return np.asarray(tokens, dtype=np.int64), counts
