"""The sampling half of one engine step: which hidden rows become logits, and what is drawn.

Rows: one per plan entry that completes a chunk (plan.sample_indices >= 0); for a request with
n / best_of > 1 whose prompt just completed, one row per sample, drawn from the same logits with
each sample's own generator (the samples then fork in the scheduler); plus, for requests asking
for prompt logprobs, one row per prompt position of their prefill chunk.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from pagedkv.engine.outputs import Logprob
from pagedkv.engine.request_state import RequestState, SeqState
from pagedkv.engine.sampler import SamplerOutput, SamplingRow
from pagedkv.engine.structured_output import apply_logits_processors

Entry = Tuple[RequestState, SeqState]


class StepSampling:
    def __init__(self, engine: Any, plan: Any, entries: List[Entry]) -> None:
        self.engine, self.plan, self.entries = engine, plan, entries
        # entry index -> [(sample, token)] of the samples that fork from that entry
        self.forks: Dict[int, List[Tuple[SeqState, int]]] = {}
        # id(seq) -> (sampled token's logprob or None, top-k dict or None)
        self.logprobs: Dict[int, Tuple[Optional[float], Optional[dict]]] = {}
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

    def run(self, hidden: torch.Tensor) -> np.ndarray:
        plan, n = self.plan, len(self.entries)
        sample_idx = np.asarray(plan.sample_indices[:n])
        if all(req.argmax_row(seq) for req, seq in self.entries):
            return self._argmax(hidden, sample_idx)
        rows: List[SamplingRow] = []
        row_src: List[int] = []  # sampling row -> its row of logits (n samples share one)
        logit_rows: List[int] = []  # distinct hidden rows to compute logits for
        owners: List[Tuple[int, SeqState]] = []
        for i, (req, seq) in enumerate(self.entries):
            idx = int(sample_idx[i])
            if idx < 0:
                continue
            group = [seq] if req.forked or len(req.seqs) == 1 or seq.token_ids else req.seqs
            logit_rows.append(idx)
            for s in group:
                rows.append(self._row(req, s))
                row_src.append(len(logit_rows) - 1)
                owners.append((i, s))
        prompt_rows, prompt_next, prompt_owner = self._prompt_logprob_rows()
        grammars = self.engine.structured
        if grammars is not None:  # on the CPU, while the device may still run the forward
            self.bitmask = grammars.fill_bitmask([s.matcher for _, s in owners])
        all_rows = torch.tensor(logit_rows + prompt_rows, dtype=torch.long, device=hidden.device)
        logits = self.engine.runner.compute_logits(hidden, all_rows)
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
        chunk = self.engine.config.max_num_seqs
        if row_src[-1] == len(rows) - 1 and len(rows) <= chunk:  # no fan-out: one batch
            return self.engine.sampler(self._constrain(logits[: len(rows)], rows, 0), rows)
        src = torch.tensor(row_src, dtype=torch.long, device=logits.device)
        merged = SamplerOutput([], [], [])
        for a in range(0, len(rows), chunk):
            # Indexing, not index_select: on CPU, index_select of repeated rows (all the n
            # samples read one row) runs about 60x slower (torch 2.13).
            part = self._constrain(logits[src[a : a + chunk]], rows[a : a + chunk], a)
            out = self.engine.sampler(part, rows[a : a + chunk])
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
            self.engine.structured.apply_bitmask(logits, mask[first : first + len(rows)])
        for i in procs:
            r = rows[i]
            apply_logits_processors(
                logits[i], r.params.logits_processors or (), r.prompt_token_ids, r.output_token_ids
            )
        return logits

    def _argmax(self, hidden: torch.Tensor, sample_idx: np.ndarray) -> np.ndarray:
        """Every row is a plain argmax (the common greedy batch): no per-row Python objects,
        one device-to-host copy. Same tokens as the Sampler's greedy path: argmax over the same
        logits, on the model's dtype (the float32 copy the Sampler makes changes no ordering)."""
        rows = np.flatnonzero(sample_idx >= 0)
        sampled = np.full(len(sample_idx), -1, dtype=np.int64)
        if not len(rows):
            return sampled
        idx = sample_idx[rows]
        picked = None  # decode-only step: every hidden row is sampled, in order
        if not (len(idx) == hidden.shape[0] and np.array_equal(idx, np.arange(len(idx)))):
            picked = torch.from_numpy(idx.astype(np.int64)).to(hidden.device)
        logits = self.engine.runner.compute_logits(hidden, picked, upcast=False)
        sampled[rows] = logits.argmax(dim=-1).cpu().numpy()
        return sampled

    def _assign(
        self, out: SamplerOutput, owners: List[Tuple[int, SeqState]], sampled: np.ndarray
    ) -> None:
        by_entry: Dict[int, List[Tuple[SeqState, int]]] = {}
        for j, (i, s) in enumerate(owners):
            by_entry.setdefault(i, []).append((s, out.token_ids[j]))
            self.logprobs[id(s)] = (out.sampled_logprobs[j], out.logprobs[j])
        for i, group in by_entry.items():
            req, _ = self.entries[i]
            if len(group) == 1:
                sampled[i] = group[0][1]
                continue
            # n > 1: the scheduler's parent must outlive this step to be forked from, so give
            # that role to a sample whose first token does not finish it, when there is one.
            k = next(
                (
                    j
                    for j, (s, t) in enumerate(group)
                    if req.would_finish(len(s.token_ids) + 1, t) is None
                ),
                0,
            )
            parent, tok = group[k]
            old_parent = self.entries[i][1]
            sched_id = old_parent.sched_id
            old_parent.sched_id = None
            parent.sched_id = sched_id
            self.engine.seq_owner[parent.sched_id] = (req, parent)
            self.entries[i] = (req, parent)
            sampled[i] = tok
            self.forks[i] = [g for j, g in enumerate(group) if j != k]

    def _prompt_logprob_rows(self) -> Tuple[List[int], List[int], List[Tuple[RequestState, int]]]:
        plan = self.plan
        rows: List[int] = []
        nxt: List[int] = []
        owner: List[Tuple[RequestState, int]] = []
        for i in range(int(plan.num_prefills)):
            req, seq = self.entries[i]
            if req.prompt_logprobs is None or seq.token_ids:
                continue
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
        dicts = self.engine.sampler.prompt_logprobs(logits, nxt, k)
        for (req, pos), d in zip(owner, dicts):
            want = req.params.prompt_logprobs or 0
            keep = {
                t: lp
                for t, lp in d.items()
                if lp.rank is not None and (lp.rank <= want or t == req.prompt_token_ids[pos])
            }
            self.engine.decode_logprob_tokens(keep)
            assert req.prompt_logprobs is not None and len(req.prompt_logprobs) == pos
            req.prompt_logprobs.append(_with_ranks(keep))


def _with_ranks(d: Dict[int, Logprob]) -> Dict[int, Logprob]:
    return dict(sorted(d.items(), key=lambda kv: kv[1].rank or 0))
