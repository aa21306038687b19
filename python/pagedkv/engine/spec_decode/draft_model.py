"""Draft-model speculation (vLLM's ``speculative_config={"model": ...}``): a small model with the
target's vocabulary proposes k tokens per decoding sequence, the target verifies them.

The draft has its own paged KV cache (its own layers and heads) indexed by the SAME block ids as
the target's: the scheduler and block allocator are shared, every sequence has one block table,
and the plan's block work (swaps, copy-on-write copies) is applied to both caches. A draft
token's KV slot must exist before the draft writes it, so the engine reserves the drafts'
slots first: after a step, each sequence that may speculate gets k placeholder drafts
(``reserve``); the next schedule() lays them out (or fewer, within its budget) with their slots;
then, before the target's forward, ``propose`` runs the draft model over the plan and writes
its drafts into the plan's input ids, where the target verifies them and
Scheduler.update_accepted checks them. Rejected drafts' slots go back through the scheduler's
rollback; the draft's KV there is overwritten before anyone reads it, like the target's.

Per step the draft runs k forwards:
1. a catch-up over every plan entry: the positions the draft has not written yet (a prefill
   chunk; a decode's last token; after a step that accepted every draft, also the last draft,
   whose KV the draft never computed) -- so the draft's cache follows the target's, including
   blocks the prefix cache hands to later requests (one exception: a sequence that ends right
   after accepting all its drafts leaves the draft's slot of its last draft unwritten; a later
   prompt repeating that output reads it -- zeros or an older value, never the target's KV,
   costing acceptance only). Its last row of a speculating entry gives draft 1;
2. k - 1 one-token decode forwards over the speculating entries, each feeding the previous
   draft (on the device when all of them are plain greedy: one host sync for the k drafts).
Greedy requests draft the argmax (after the request's penalties and bans); random ones draw
from q, the draft's distribution under the request's sampling knobs, and keep q for the
rejection sampler, so the emitted tokens follow the target's distribution exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

import numpy as np
import torch

from pagedkv.engine.model_runner import to_device
from pagedkv.engine.plan_arrays import PlanArrays
from pagedkv.engine.request_failures import FAILED, try_batch
from pagedkv.engine.request_state import RequestState, SeqState
from pagedkv.engine.sampler import Sampler, SamplingRow

Entry = Tuple[RequestState, SeqState]
# The request's sampling row after some drafts (speculator.sampling_row).
RowFn = Callable[[RequestState, SeqState, List[int]], SamplingRow]
_NO_PAIRS = np.zeros((0, 2), dtype=np.int64)
# What the draft has not seen of one plan entry: (entry, first position, its token ids).
_Feed = Tuple[int, int, np.ndarray]


@dataclass
class _Speculating:
    """A plan entry the draft proposes for this step."""

    index: int  # the plan entry
    sched_id: str
    req: RequestState
    seq: SeqState
    k: int  # drafts the scheduler laid out for it
    end: int  # first position after the sequence's tokens (the first draft's position)
    table: np.ndarray  # its block table row
    drafts: List[int]


class DraftModelProposer:
    def __init__(self, runner: Any, sampler: Sampler, num_speculative_tokens: int) -> None:
        self.runner = runner  # the draft's ModelRunner (its own KV cache, same block ids)
        self.sampler = sampler
        self.k = num_speculative_tokens
        self.block_size = int(runner.block_size)
        # Scheduler id -> how many leading positions of the sequence the draft's cache holds.
        self._written: Dict[str, int] = {}
        self._spec: Dict[int, _Speculating] = {}  # this step's speculating entries by index
        # This step's draft distributions q [k, vocab] of the random entries, by plan entry.
        self.draft_probs: Dict[int, torch.Tensor] = {}
        # While drafting: each draft forward's q rows, and the plan entry of each row.
        self._q_parts: List[torch.Tensor] = []
        self._q_entries: List[int] = []

    # ------------------------------------------------------------------ before schedule()
    def reserve(self, scheduler: Any, seqs: Iterable[Tuple[Entry, int]]) -> None:
        """k placeholder drafts (``room`` fewer near max_tokens) for each sequence: the next
        schedule() gives their slots, propose() writes the real drafts."""
        for (_, seq), room in seqs:
            assert seq.sched_id is not None
            scheduler.set_draft_tokens(seq.sched_id, [0] * min(self.k, room))

    # ------------------------------------------------------------------ before the forward
    @torch.inference_mode()
    def propose(
        self,
        plan: Any,
        entries: List[Optional[Entry]],
        live: Mapping[str, Any],
        sampling_row: RowFn,
    ) -> None:
        """Runs the draft over ``plan`` and writes its drafts into the plan's input ids.
        ``live``: the engine's sequences by scheduler id (the others are forgotten here).
        ``sampling_row(req, seq, drafts)``: the request's sampling row after ``drafts``."""
        self.draft_probs, self._q_parts, self._q_entries = {}, [], []
        self.runner.apply_block_ops(plan)  # the plan's swaps and copies, on the draft's cache
        if len(self._written) > len(live):
            self._written = {s: n for s, n in self._written.items() if s in live}
        n = int(plan.num_seqs)
        nd = np.asarray(plan.num_draft_tokens[:n])
        self._spec = {}
        first = self._catch_up(plan, entries)
        if first is None:
            return
        hidden, last_rows = first
        spec = list(self._spec.values())
        if not spec:
            return
        # (From pinned memory: a pageable copy would wait for the draft's forward first.)
        rows = to_device(torch.tensor([last_rows[s.index] for s in spec]), hidden.device)
        logits = self.runner.compute_logits(hidden, rows)
        if all(s.req.argmax_row(s.seq) for s in spec):
            self._argmax_chain(plan, spec, logits)
        else:
            self._draw(spec, logits, sampling_row)
            for j in range(1, int(nd.max())):
                active = [s for s in spec if s.k > j]
                ids = np.array([s.drafts[-1] for s in active], dtype=np.int32)
                hidden = self.runner.execute(self._decode_arrays(plan, active, j, ids))
                picked = torch.arange(len(active), device=hidden.device)
                self._draw(active, self.runner.compute_logits(hidden, picked), sampling_row)
        qsl = np.asarray(plan.query_start_loc[: n + 1])
        ids = plan.input_ids  # (writable view: the target and update_accepted read it)
        for s in spec:
            end = int(qsl[s.index + 1])
            ids[end - s.k : end] = s.drafts
            # KV written up to the draft before the last one (the last is fed next step).
            self._written[s.sched_id] = s.end + s.k - 1
        self._collect_q()

    def accepted(self, index: int, num_accepted: int) -> None:
        """Entry ``index`` kept ``num_accepted`` drafts: the draft's KV past them is stale."""
        s = self._spec.get(index)
        if s is not None:
            self._written[s.sched_id] = min(self._written.get(s.sched_id, 0), s.end + num_accepted)

    # ------------------------------------------------------------------ the forwards
    def _catch_up(
        self, plan: Any, entries: List[Optional[Entry]]
    ) -> Optional[Tuple[torch.Tensor, Dict[int, int]]]:
        """Forward 1 over every entry's unwritten positions, without the drafts. Entries with
        several tokens come first (the extend path), one-token entries last (the decode path:
        a plain decode step replays the draft's CUDA graphs). Returns the hidden states and the
        row of each speculating entry's last token."""
        feeds = self._feeds(plan, entries)
        if not feeds:
            return None
        feeds.sort(key=lambda f: len(f[2]) == 1)  # (stable: plan order within each group)
        arrays = self._feed_arrays(plan, feeds)
        hidden = self.runner.execute(arrays)
        qsl_draft = arrays.query_start_loc
        last = {f[0]: int(qsl_draft[j + 1]) - 1 for j, f in enumerate(feeds)}
        return hidden, last

    def _feeds(self, plan: Any, entries: List[Optional[Entry]]) -> List[_Feed]:
        """What the draft has not seen of each entry (its own tokens up to the drafts, after
        the positions it wrote before); registers the speculating entries in ``self._spec``
        and marks everything fed as written."""
        n = int(plan.num_seqs)
        qsl = np.asarray(plan.query_start_loc[: n + 1])
        ctx = np.asarray(plan.context_lens[:n])
        nd = np.asarray(plan.num_draft_tokens[:n])
        input_ids = np.asarray(plan.input_ids)
        feeds: List[_Feed] = []
        for i, entry in enumerate(entries[:n]):
            sid = entry[1].sched_id if entry is not None else None
            if entry is None or sid is None:
                continue
            req, seq = entry
            c = int(ctx[i])
            start = min(self._written.get(sid, c), c)
            own = input_ids[qsl[i] : qsl[i + 1] - nd[i]]
            toks = own if start == c else np.concatenate([_tokens(req, seq, start, c), own])
            feeds.append((i, start, toks))
            end = c + len(own)
            self._written[sid] = end
            if nd[i] > 0:
                table = np.asarray(plan.block_tables[i])
                self._spec[i] = _Speculating(i, sid, req, seq, int(nd[i]), end, table, [])
        return feeds

    def _feed_arrays(self, plan: Any, feeds: List[_Feed]) -> PlanArrays:
        """The draft's step over ``feeds`` (multi-token entries first): its own slots, from
        the target's block tables."""
        return self._step_arrays(
            int(plan.step),
            [np.asarray(plan.block_tables[f[0]]) for f in feeds],
            np.array([f[1] for f in feeds], dtype=np.int64),
            np.array([len(f[2]) for f in feeds], dtype=np.int32),
            np.concatenate([f[2] for f in feeds]).astype(np.int32),
        )

    def _step_arrays(
        self,
        step: int,
        tables: List[np.ndarray],
        starts: np.ndarray,
        lens: np.ndarray,
        input_ids: np.ndarray,
    ) -> PlanArrays:
        """A draft forward of ``lens[i]`` tokens from position ``starts[i]`` of each entry
        (multi-token entries first), written through the entries' block-table rows."""
        multi = int((lens > 1).sum())
        positions = np.concatenate([np.arange(s, s + m) for s, m in zip(starts, lens)])
        entry_of_token = np.repeat(np.arange(len(lens)), lens)
        width = max(1, -(-int((starts + lens).max()) // self.block_size))
        table_arr = np.stack([t[:width] for t in tables]).astype(np.int32)
        slots = _slots(table_arr[entry_of_token], positions, self.block_size)
        seq_lens = (starts + lens).astype(np.int32)
        return PlanArrays(
            step=step,
            num_seqs=len(lens),
            num_prefills=multi,
            num_prefill_tokens=int(lens[:multi].sum()),
            num_decode_tokens=len(lens) - multi,
            num_tokens=int(lens.sum()),
            max_query_len=int(lens.max()),
            max_decode_seq_len=int(seq_lens[multi:].max()) if multi < len(lens) else 0,
            input_ids=input_ids,
            positions=positions,
            slot_mapping=slots,
            seq_lens=seq_lens,
            query_start_loc=np.concatenate([[0], np.cumsum(lens)]).astype(np.int32),
            block_tables=table_arr,
            blocks_to_swap_out=_NO_PAIRS,
            blocks_to_swap_in=_NO_PAIRS,
            blocks_to_copy=_NO_PAIRS,
        )

    def _argmax_chain(self, plan: Any, spec: List[_Speculating], logits: torch.Tensor) -> None:
        """Plain greedy drafts for every entry, chained on the device: each draft forward reads
        the previous one's argmax through the runner's placeholder ids (-1 - row, as in an
        overlapped step), so the host waits once for all k drafts, not once per draft."""
        prev = logits.argmax(dim=-1)
        steps, where = [prev], [np.arange(len(spec))]  # per draft: tokens, each entry's row
        for j in range(1, max(s.k for s in spec)):
            act = [r for r, s in enumerate(spec) if s.k > j]
            ids = (-1 - where[-1][act]).astype(np.int32)
            arrays = self._decode_arrays(plan, [spec[r] for r in act], j, ids)
            hidden = self.runner.execute(arrays, prev_tokens=prev)
            picked = torch.arange(len(act), device=hidden.device)
            prev = self.runner.compute_logits(hidden, picked).argmax(dim=-1)
            row = np.full(len(spec), -1)
            row[act] = np.arange(len(act))
            steps.append(prev)
            where.append(row)
        flat = torch.cat(steps).tolist()  # the one host sync
        offsets = np.cumsum([0] + [len(t) for t in steps])
        for r, s in enumerate(spec):
            s.drafts = [int(flat[offsets[j] + where[j][r]]) for j in range(s.k)]

    def _decode_arrays(
        self, plan: Any, active: List[_Speculating], j: int, ids: np.ndarray
    ) -> PlanArrays:
        """One token per active entry: its draft j - 1 (``ids``) at position end + j - 1."""
        return self._step_arrays(
            int(plan.step),
            [s.table for s in active],
            np.array([s.end + j - 1 for s in active], dtype=np.int64),
            np.ones(len(active), dtype=np.int32),
            ids,
        )

    # ------------------------------------------------------------------ drafting
    def _draw(self, active: List[_Speculating], logits: torch.Tensor, sampling_row: RowFn) -> None:
        """Appends each active entry's next draft: the argmax for greedy requests (after their
        knobs), a draw from q for random ones (q kept for the rejection sampler)."""
        tokens = logits.argmax(dim=-1)
        plain = [s.req.argmax_row(s.seq) for s in active]
        greedy = [r for r, s in enumerate(active) if not plain[r] and _greedy(s)]
        random = [r for r, s in enumerate(active) if not plain[r] and not _greedy(s)]
        if greedy:
            g = torch.tensor(greedy, device=logits.device)
            rows = [sampling_row(active[r].req, active[r].seq, active[r].drafts) for r in greedy]
            tokens[g] = _knobbed(Sampler.processed_logits, _raw_logits, logits[g], rows).argmax(
                dim=-1
            )
        if random:
            g = torch.tensor(random, device=logits.device)
            rows = [sampling_row(active[r].req, active[r].seq, active[r].drafts) for r in random]
            q = _knobbed(Sampler.target_probs, _raw_probs, logits[g], rows)
            tokens[g] = self.sampler.draw(q, rows)
            self._q_parts.append(q)
            self._q_entries += [active[r].index for r in random]
        for s, t in zip(active, tokens.tolist()):
            s.drafts.append(int(t))

    def _collect_q(self) -> None:
        """draft_probs: each random entry's q rows [k, vocab] in draft order, on the host (one
        copy from the device for the whole step)."""
        if not self._q_parts:
            return
        rows = torch.cat(self._q_parts).cpu()
        entries = np.asarray(self._q_entries)
        # Grouped by entry, each group in draft order (one part per draft forward).
        order = np.argsort(entries, kind="stable")
        ids, starts = np.unique(entries[order], return_index=True)
        for i, group in zip(ids.tolist(), np.split(order, starts[1:])):
            self.draft_probs[i] = rows[torch.from_numpy(group)]


KnobFn = Callable[[torch.Tensor, List[SamplingRow]], torch.Tensor]


def _knobbed(
    knobs: KnobFn, plain: Callable[[torch.Tensor], torch.Tensor], logits: torch.Tensor, rows: Any
) -> torch.Tensor:
    """``knobs(logits, rows)``; where that raises (not a device error), row by row, with
    ``plain(row)`` for a row whose own knobs raise. A draft is only a proposal: its request is
    blamed when verification applies the same knobs to the target's rows (Speculator.verify),
    and a draft drawn from another q is still verified exactly (q goes with it)."""
    batch = try_batch(lambda: knobs(logits, rows))
    if batch is not FAILED:
        return batch

    def row_knobs(j: int, row: SamplingRow) -> Callable[[], torch.Tensor]:
        return lambda: knobs(logits[j : j + 1], [row])[0]

    out = []
    for j, row in enumerate(rows):
        one = try_batch(row_knobs(j, row))
        out.append(plain(logits[j]) if one is FAILED else one)
    return torch.stack(out)


def _raw_logits(logits: torch.Tensor) -> torch.Tensor:
    return logits.float()


def _raw_probs(logits: torch.Tensor) -> torch.Tensor:
    return logits.float().softmax(dim=-1)


def _greedy(s: _Speculating) -> bool:
    return bool(s.req.params.sampling_type_greedy)


def _tokens(req: RequestState, seq: SeqState, start: int, stop: int) -> np.ndarray:
    """The sequence's tokens at positions [start, stop) (prompt, then output)."""
    prompt = req.prompt_token_ids
    p = len(prompt)
    out = [prompt[i] if i < p else seq.token_ids[i - p] for i in range(start, stop)]
    return np.asarray(out, dtype=np.int32)


def _slots(tables: np.ndarray, positions: np.ndarray, block_size: int) -> np.ndarray:
    """KV slot of each position in its row of ``tables`` (one row per position)."""
    rows = np.arange(len(positions))
    blocks = tables[rows, positions // block_size].astype(np.int64)
    return blocks * block_size + positions % block_size
