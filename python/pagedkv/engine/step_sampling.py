"""The sampling half of one engine step: which hidden rows become logits, and what is drawn.

Rows: one per plan entry that completes a chunk (plan.sample_indices >= 0); for a request with
n / best_of > 1 whose prompt just completed, one row per sample, drawn from the same logits with
each sample's own generator (the samples then fork in the scheduler); plus, for requests asking
for prompt logprobs, one row per prompt position of their prefill chunk.

It reads the step's plan and request states and writes nothing but its own results (tokens,
logprobs, forks, the parent of each n > 1 group, prompt logprobs, the requests whose own work
raised): the engine core applies them. Per-request work (building a row's bans, a grammar's
bitmask, logits processors, the sampler's penalties and logprobs) runs under a guard naming the
request: an error there fails that request alone (its rows draw nothing), the others go on.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple, cast

import numpy as np
import torch

from pagedkv.engine.model_runner import to_device
from pagedkv.engine.outputs import Logprob
from pagedkv.engine.request_failures import FAILED, RequestFailures, try_batch
from pagedkv.engine.request_state import RequestState, SeqState
from pagedkv.engine.sampler import Sampler, SamplerOutput, SamplingRow
from pagedkv.engine.structured_bitmask import StructuredBitmask
from pagedkv.engine.structured_output import apply_logits_processors

Entry = Tuple[RequestState, SeqState]
# A token's logprobs: (the sampled token's logprob or None, the top-k dict or None).
TokenLogprob = Tuple[Optional[float], Optional[Dict[int, Logprob]]]


class StepSampling:
    """Samples one step. ``compute_logits(hidden, rows, upcast)`` is the runner's (or the
    executor's) LM head; ``grammars`` hands out the rows' structured-output bitmasks
    (prefetched since the matchers took the last tokens) and applies them;
    ``would_finish(sched_id, token)`` asks the scheduler whether the token ends that sequence;
    ``max_rows`` bounds the rows sampled at once (max_num_seqs). ``entries`` hold None for plan
    entries not to be sampled (aborted since the plan was made)."""

    def __init__(
        self,
        compute_logits: Callable[..., torch.Tensor],
        sampler: Sampler,
        grammars: Optional[StructuredBitmask],
        would_finish: Callable[[str, int], bool],
        max_rows: int,
        plan: object,
        entries: List[Optional[Entry]],
    ) -> None:
        self.compute_logits, self.sampler, self.grammars = compute_logits, sampler, grammars
        self.would_finish, self.max_rows = would_finish, max_rows
        self.plan: Any = plan
        self.entries = entries
        # The step's tokens on the host when they were drawn there (else None: see host()).
        self.tokens: Optional[np.ndarray] = None
        # entry index -> [(sample, token)] of the samples that fork from that entry
        self.forks: Dict[int, List[Tuple[SeqState, int]]] = {}
        # entry index -> the sample that goes on under the entry's scheduler id (n > 1)
        self.parents: Dict[int, SeqState] = {}
        # id(seq) -> its token's logprobs
        self.logprobs: Dict[int, TokenLogprob] = {}
        # (request, prompt position, {token: Logprob}) for each prompt position scored
        self.prompt_logprobs: List[Tuple[RequestState, int, Dict[int, Logprob]]] = []
        # The requests whose own work raised (their rows drew nothing: the core aborts them).
        self.failures: RequestFailures[RequestState] = RequestFailures()
        self._row_reqs: List[RequestState] = []  # sampling row -> its request
        # Structured outputs: allowed tokens of each sampling row (None: no row constrained).
        self.bitmask: Optional[torch.Tensor] = None

    def _row(self, req: RequestState, seq: SeqState) -> SamplingRow:
        p = req.params
        return SamplingRow(
            p,
            req.prompt_token_ids,
            seq.token_ids,
            seq.generator,
            req.banned_tokens(seq),
            need_logprob=(p.best_of or p.n) > p.n,
        )

    def run(self, hidden: torch.Tensor) -> torch.Tensor:
        """[num entries] int64 tokens on the hidden states' device, -1 where nothing was
        sampled. The plain-argmax batch stays on the device (no host sync: an overlapped step
        reads it on the host only after launching the next one)."""
        plan, n = self.plan, len(self.entries)
        sample_idx = np.asarray(plan.sample_indices[:n])
        live = cast(List[Entry], self.entries)  # (no None: checked next)
        if None in self.entries:
            live = [e for e in self.entries if e is not None]
            sample_idx = sample_idx.copy()
            sample_idx[[i for i, e in enumerate(self.entries) if e is None]] = -1
        # (the per-request flag first: one attribute read per row on a plain greedy batch)
        if all([req.always_argmax for req, _ in live]) or all(
            req.argmax_row(seq) for req, seq in live
        ):
            return self._argmax(hidden, sample_idx)
        self.tokens = self._draw(hidden, sample_idx)
        return to_device(torch.from_numpy(self.tokens), hidden.device)

    def host(self, device_tokens: torch.Tensor) -> np.ndarray:
        """run()'s tokens on the host (copied, waiting for the device, if drawn there)."""
        if self.tokens is None:
            self.tokens = device_tokens.cpu().numpy()
        return self.tokens

    def _draw(self, hidden: torch.Tensor, sample_idx: np.ndarray) -> np.ndarray:
        """Samples the rows one by one on the host: knobs, n > 1, logprobs, grammars."""
        n = len(self.entries)
        rows: List[SamplingRow] = []
        row_src: List[int] = []  # sampling row -> its row of logits (n samples share one)
        logit_rows: List[int] = []  # distinct hidden rows to compute logits for
        owners: List[Tuple[int, SeqState]] = []
        for i, entry in enumerate(self.entries):
            idx = int(sample_idx[i])
            if idx < 0 or entry is None:
                continue
            req, seq = entry
            group = [seq] if req.forked or len(req.seqs) == 1 or seq.token_ids else req.seqs
            built: List[SamplingRow] = []
            with self.failures.guard(req):
                built = [self._row(req, s) for s in group]
            if req in self.failures:
                continue
            logit_rows.append(idx)
            for s, row in zip(group, built):
                rows.append(row)
                row_src.append(len(logit_rows) - 1)
                owners.append((i, s))
                self._row_reqs.append(req)
        prompt_rows, prompt_next, prompt_owner = self._prompt_logprob_rows()
        # The logits are launched before the bitmask is waited for (no host wait in between:
        # the rows go to the device from pinned memory), so that the fill's last part overlaps
        # the device's forward.
        all_rows = to_device(
            torch.tensor(logit_rows + prompt_rows, dtype=torch.long), hidden.device
        )
        logits = self.compute_logits(hidden, all_rows)
        if self.grammars is not None:
            self.bitmask = self._take_bitmask(self.grammars, [s for _, s in owners], hidden.device)
        sampled = np.full(n, -1, dtype=np.int64)
        if rows:
            self._assign(self._sample(logits, rows, row_src), owners, sampled)
        if prompt_rows:
            self._prompt_logprobs(logits[len(logit_rows) :], prompt_next, prompt_owner)
        return sampled

    def _sample(
        self, logits: torch.Tensor, rows: List[SamplingRow], row_src: List[int]
    ) -> SamplerOutput:
        """Samples every row from its logits row. The sampler holds several [rows, vocab] fp32
        tensors, so the n samples of a prompt (n may be 100000) go in chunks of at most
        max_num_seqs rows: memory stays bounded by the batch limit, as in a decode step. A
        seeded sample draws from its own generator, so chunking does not change its tokens."""
        chunk = self.max_rows
        if row_src[-1] == len(rows) - 1 and len(rows) <= chunk:  # no fan-out: one batch
            return self._draw_batch(self._constrain(logits[: len(rows)], rows, 0), rows, 0)
        src = torch.tensor(row_src, dtype=torch.long, device=logits.device)
        merged = SamplerOutput([], [], [])
        for a in range(0, len(rows), chunk):
            # Indexing, not index_select: on CPU, index_select of repeated rows (all the n
            # samples read one row) runs about 60x slower (torch 2.13).
            part = self._constrain(logits[src[a : a + chunk]], rows[a : a + chunk], a)
            out = self._draw_batch(part, rows[a : a + chunk], a)
            merged.token_ids += out.token_ids
            merged.sampled_logprobs += out.sampled_logprobs
            merged.logprobs += out.logprobs
        return merged

    def _constrain(self, logits: torch.Tensor, rows: List[SamplingRow], first: int) -> torch.Tensor:
        """Applies the grammar bitmask and the logits processors of sampling rows
        [first, first + len(rows)) to their logits (own rows: a fan-out copies them)."""
        mask = self.bitmask
        procs = [i for i, r in enumerate(rows) if r.params.logits_processors]
        if mask is None and not procs:
            return logits
        logits = logits.float() if logits.dtype != torch.float32 else logits
        if mask is not None:
            assert self.grammars is not None
            self.grammars.apply(logits, mask[first : first + len(rows)])
        for i in procs:
            r = rows[i]
            req = self._row_reqs[first + i]
            with self.failures.guard(req):
                apply_logits_processors(
                    logits[i],
                    r.params.logits_processors or (),
                    r.prompt_token_ids,
                    r.output_token_ids,
                )
            if req in self.failures:
                with torch.inference_mode():  # (the step's logits are inference tensors)
                    logits[i] = 0.0  # whatever the processor left: the row must stay drawable
        return logits

    def _draw_batch(
        self, logits: torch.Tensor, rows: List[SamplingRow], first: int
    ) -> SamplerOutput:
        """The sampler over rows [first, first + len(rows)). If the batch raises, the rows are
        drawn one by one to find the culprits: their requests are blamed and draw nothing
        (token -1), the other rows keep their tokens (greedy ones the same; a seeded row may
        have drawn from its generator in the failed batch already)."""
        batch = try_batch(lambda: self.sampler(logits, rows))
        if batch is not FAILED:
            return batch
        out = SamplerOutput([], [], [])
        for j, row in enumerate(rows):
            one = SamplerOutput([-1], [None], [None])
            with self.failures.guard(self._row_reqs[first + j]):
                one = self.sampler(logits[j : j + 1], [row])
            out.token_ids += one.token_ids
            out.sampled_logprobs += one.sampled_logprobs
            out.logprobs += one.logprobs
        return out

    def _take_bitmask(
        self, bitmask: StructuredBitmask, seqs: List[SeqState], device: torch.device
    ) -> Optional[torch.Tensor]:
        """The rows' bitmask on ``device``; if filling it raises, the matchers are tried one by
        one and the requests of those that raise are blamed (their rows are left
        unconstrained: they draw nothing that is kept)."""
        taken = try_batch(lambda: bitmask.take(seqs, device))
        if taken is not FAILED:
            return taken
        for j, s in enumerate(seqs):
            if s.matcher is not None:
                with self.failures.guard(self._row_reqs[j]):
                    bitmask.grammars.fill_bitmask([s.matcher])
        kept = [None if self._row_reqs[j] in self.failures else s for j, s in enumerate(seqs)]
        return bitmask.take(kept, device)

    def _argmax(self, hidden: torch.Tensor, sample_idx: np.ndarray) -> torch.Tensor:
        """Every row is a plain argmax (the common greedy batch): no per-row Python objects,
        no host sync. Same tokens as the Sampler's greedy path: argmax over the same logits,
        on the model's dtype (the float32 copy the Sampler makes changes no ordering)."""
        n, dev = len(sample_idx), hidden.device
        rows = np.flatnonzero(sample_idx >= 0)
        if not len(rows):
            self.tokens = np.full(n, -1, dtype=np.int64)
            return to_device(torch.from_numpy(self.tokens), dev)
        idx = sample_idx[rows]
        picked = None  # decode-only step: every hidden row is sampled, in order
        if not (len(idx) == hidden.shape[0] and np.array_equal(idx, np.arange(len(idx)))):
            picked = to_device(torch.from_numpy(idx.astype(np.int64)), dev)
        tokens = self.compute_logits(hidden, picked, upcast=False).argmax(dim=-1)
        if len(rows) == n:
            return tokens
        out = torch.full((n,), -1, dtype=torch.int64, device=tokens.device)
        out[to_device(torch.from_numpy(rows.astype(np.int64)), tokens.device)] = tokens
        return out

    def _assign(
        self, out: SamplerOutput, owners: List[Tuple[int, SeqState]], sampled: np.ndarray
    ) -> None:
        by_entry: Dict[int, List[Tuple[SeqState, int]]] = {}
        for j, (i, s) in enumerate(owners):
            by_entry.setdefault(i, []).append((s, out.token_ids[j]))
            self.logprobs[id(s)] = (out.sampled_logprobs[j], out.logprobs[j])
        for i, group in by_entry.items():
            entry = self.entries[i]
            assert entry is not None
            if entry[0] in self.failures:
                continue  # draws nothing (-1): the core aborts the request
            if len(group) == 1:
                sampled[i] = group[0][1]
                continue
            # n > 1: the scheduler's parent must outlive this step to be forked from, so give
            # that role to a sample whose first token does not finish it, when there is one.
            sched_id = entry[1].sched_id
            assert sched_id is not None
            k = next((j for j, (_, t) in enumerate(group) if not self.would_finish(sched_id, t)), 0)
            parent, sampled[i] = group[k]
            self.parents[i] = parent
            self.forks[i] = [g for j, g in enumerate(group) if j != k]

    def _prompt_logprob_rows(self) -> Tuple[List[int], List[int], List[Tuple[RequestState, int]]]:
        plan = self.plan
        rows: List[int] = []
        nxt: List[int] = []
        owner: List[Tuple[RequestState, int]] = []
        for i in range(int(plan.num_prefills)):
            entry = self.entries[i]
            if entry is None or entry[0].prompt_logprobs is None or entry[1].token_ids:
                continue
            req = entry[0]
            assert req.prompt_logprobs is not None
            total = len(req.prompt_token_ids)
            ctx = int(plan.context_lens[i])
            q0, q1 = int(plan.query_start_loc[i]), int(plan.query_start_loc[i + 1])
            # Row at position p predicts prompt token p + 1; skip what earlier chunks gave.
            first = max(ctx, len(req.prompt_logprobs) - 1)
            last = min(ctx + (q1 - q0), total - 1)
            for p in range(first, last):
                rows.append(q0 + p - ctx)
                nxt.append(req.prompt_token_ids[p + 1])
                owner.append((req, p + 1))
        return rows, nxt, owner

    def _prompt_logprobs(
        self, logits: torch.Tensor, nxt: List[int], owner: List[Tuple[RequestState, int]]
    ) -> None:
        k = max(r.params.prompt_logprobs or 0 for r, _ in owner)
        batch = try_batch(lambda: self.sampler.prompt_logprobs(logits, nxt, k))
        dicts: List[Optional[Dict[int, Logprob]]] = (
            self._prompt_logprobs_by_request(logits, nxt, owner) if batch is FAILED else list(batch)
        )
        for (req, pos), d in zip(owner, dicts):
            if d is None or req in self.failures:
                continue
            want = req.params.prompt_logprobs or 0
            keep = {
                t: lp
                for t, lp in d.items()
                if lp.rank is not None and (lp.rank <= want or t == req.prompt_token_ids[pos])
            }
            self.prompt_logprobs.append((req, pos, _with_ranks(keep)))

    def _prompt_logprobs_by_request(
        self, logits: torch.Tensor, nxt: List[int], owner: List[Tuple[RequestState, int]]
    ) -> List[Optional[Dict[int, Logprob]]]:
        """The batch raised: each request's rows on their own, to blame the culprits (None
        for their rows)."""
        dicts: List[Optional[Dict[int, Logprob]]] = [None] * len(owner)
        rows: Dict[int, List[int]] = {}
        for j, (req, _) in enumerate(owner):
            rows.setdefault(id(req), []).append(j)
        for idx in rows.values():
            req = owner[idx[0]][0]
            k = req.params.prompt_logprobs or 0
            with self.failures.guard(req):
                got = self.sampler.prompt_logprobs(logits[idx], [nxt[j] for j in idx], k)
                for j, d in zip(idx, got):
                    dicts[j] = d
        return dicts


def _with_ranks(d: Dict[int, Logprob]) -> Dict[int, Logprob]:
    return dict(sorted(d.items(), key=lambda kv: kv[1].rank or 0))
