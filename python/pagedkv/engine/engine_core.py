"""EngineCore: schedule -> execute -> sample -> update, one step at a time (vLLM v1's core).

The core owns the device side of requests: their sequences in the scheduler (by scheduler id),
LoRA admission, the model runner (or the executor over several ranks) and the sampler. Each step
it hands back what happened to each sequence (a StepResult: tokens, their logprobs, which
sequences finished); turning that into text and RequestOutputs is the output processor's job.
Why a sequence finished is decided by the C++ scheduler only (EOS ids, stop ids, min_tokens,
max_tokens), and by a structured-output grammar reaching its end; stop *strings* need text, so
the output processor finds them and the core then stops the sequence (stop_sequence).
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set, Tuple, Union

import numpy as np
import torch

from pagedkv.engine.outputs import Logprob
from pagedkv.engine.request_state import RequestState, SeqState
from pagedkv.engine.sampler import Sampler
from pagedkv.engine.spec_decode.speculator import Speculator, emitted_arrays
from pagedkv.engine.step_sampling import Entry, StepSampling, TokenLogprob
from pagedkv.engine.structured_output import GrammarCache, advance
from pagedkv.lora.admission import LoRAAdmission


@dataclass
class SeqUpdate:
    """One token appended to one sequence (already in seq.token_ids)."""

    req: RequestState
    seq: SeqState
    token: int
    logprob: Optional[TokenLogprob]
    # The scheduler finished the sequence with this token (seq.finish_reason says why); a
    # grammar that ended is not a scheduler finish (the token is shown, as in the serial
    # engine before the split).
    sched_finished: bool


@dataclass
class StepResult:
    """What one step did, in batch order (forked samples right after their parent's entry)."""

    now: float  # when the step was scheduled: its tokens all count as arriving then
    updates: List[SeqUpdate]
    # Prompt-logprob entries this step added (to req.prompt_logprobs), for their token texts.
    prompt_logprobs: List[Dict[int, Logprob]]


class EngineCore:
    def __init__(
        self,
        scheduler: Any,
        runner: Any,
        sampler: Sampler,
        grammars: Optional[GrammarCache],
        max_num_seqs: int,
        lora_admission: Optional[LoRAAdmission] = None,
        speculator: Optional[Speculator] = None,
    ) -> None:
        self.scheduler, self.runner, self.sampler = scheduler, runner, sampler
        self.speculator = speculator  # n-gram speculative decoding (speculative_config)
        self.grammars, self.max_num_seqs = grammars, max_num_seqs
        self.lora_admission = lora_admission
        self._lora_held: Set[str] = set()  # requests with an adapter, admitted or waiting
        self.seq_owner: Dict[str, Tuple[RequestState, SeqState]] = {}  # scheduler id -> seq
        # What a failed step must abort (see fail_step): the entries of the step under way.
        self._step_entries: List[Optional[Entry]] = []
        self._plan: Any = None  # scheduled, not yet passed to update()
        self._failed = False  # a failed step was interrupted while failing
        self._now = 0.0  # when the step under way was scheduled

    # ------------------------------------------------------------------ requests
    def add_request(self, req: RequestState, priority: int) -> None:
        """Queues the request, or holds it until its LoRA adapter may be loaded."""
        if req.lora_id and self.lora_admission is not None:
            self._lora_held.add(req.request_id)
        if self.lora_admission is None or self.lora_admission.admit(
            req.lora_id, req.request_id, (req, priority)
        ):
            self._add_to_scheduler(req, priority)

    def _add_to_scheduler(self, req: RequestState, priority: int) -> None:
        p = req.params
        # Prompt logprobs need logits at every prompt position: keep such a request off the
        # prefix cache with a salt of its own.
        # A request with an adapter shares cached blocks only with requests of the same one.
        salt: Union[int, str] = (
            (zlib.crc32(req.request_id.encode()) | 1)
            if p.prompt_logprobs is not None
            else (f"lora:{req.lora_id}" if req.lora_id else 0)
        )
        seq = req.seqs[0]
        seq.sched_id = req.request_id
        self.scheduler.add_request(
            req.request_id,
            req.prompt_token_ids,
            req.max_tokens,
            eos_token_ids=req.eos_token_ids,
            stop_token_ids=list(p.stop_token_ids or []),
            priority=priority,
            ignore_eos=p.ignore_eos,
            min_tokens=p.min_tokens,
            cache_salt=salt,
        )
        self.seq_owner[req.request_id] = (req, seq)

    def abort_request(self, req: RequestState) -> None:
        """Frees the request's sequences; those still running finish with "abort"."""
        for seq in req.seqs:
            if seq.sched_id is not None and not seq.finished:
                self.scheduler.abort_request(seq.sched_id)
            self.seq_owner.pop(seq.sched_id or "", None)
            if not seq.finished:
                seq.finish_reason = "abort"
        self._release_lora(req)

    def stop_sequence(self, req: RequestState, seq: SeqState) -> None:
        """``seq`` finished outside the scheduler (a stop string, an ended grammar): free it."""
        if seq.sched_id is not None and self.seq_owner.pop(seq.sched_id, None) is not None:
            self.scheduler.abort_request(seq.sched_id)
        if req.finished:
            self._release_lora(req)

    def _release_lora(self, req: RequestState) -> None:
        """``req`` left the engine: its adapter's place may go to a waiting request. Once per
        request (it may be called again, e.g. by fail_step after a finish)."""
        if self.lora_admission is None or req.request_id not in self._lora_held:
            return
        self._lora_held.discard(req.request_id)
        if self.lora_admission.drop(req.request_id):
            return  # it never reached the scheduler
        for waiting, priority in self.lora_admission.release(req.lora_id):
            if not waiting.finished:  # (an aborted one was dropped from the queue)
                self._add_to_scheduler(waiting, priority)

    @property
    def step_failed(self) -> bool:
        """A step failed and fail_step() has not completed since."""
        return self._failed

    # ------------------------------------------------------------------ one step
    def step(self) -> Optional[StepResult]:
        """Runs one step; None when nothing ran. After it raised, fail_step() must run before
        the next step."""
        assert not self._failed, "fail_step() first"
        self._step_entries = []
        plan = self._schedule()
        if plan is None:
            return None
        entries = self._step_entries = self._begin(plan)
        hidden = self._execute(plan, entries)
        work, tokens = self._sample(plan, entries, hidden)
        host = work.host(tokens)
        spec: Dict[int, List[int]] = {}
        if self.speculator is not None and int(plan.num_draft_tokens_total):
            spec = self.speculator.verify(plan, hidden, entries, self.runner.compute_logits)
        if spec:  # the speculating entries emit their verified tokens instead of one sample
            flat, counts = emitted_arrays(host, spec)
            finished = self.scheduler.update_accepted(plan, flat, counts)
            kept = self.scheduler.num_appended  # fewer where a finish came first
            spec = {i: toks[: kept[i]] for i, toks in spec.items()}
        else:
            finished = self.scheduler.update(plan, host)
        self._plan = None
        result = self._apply(entries, host, work, finished, self._now, spec)
        if self.speculator is not None:
            self.speculator.propose(self.scheduler, entries)
        return result

    def _schedule(self) -> Any:
        """The next plan, or None when it has no sequence (its block work done)."""
        plan = self.scheduler.schedule()
        if int(plan.num_seqs) == 0:
            # Nothing to run, but the plan's cache work must still happen: a swap-out left
            # undone loses the swapped sequence's KV (the next schedule() forgets the list).
            # The scheduler does not emit such a plan today (see test_scheduler's
            # test_empty_plan_carries_no_block_work); this keeps the engine correct if it does.
            if (
                len(plan.blocks_to_swap_out)
                or len(plan.blocks_to_swap_in)
                or len(plan.blocks_to_copy)
            ):
                self.runner.apply_block_ops(plan)
            return None
        self._plan = plan
        return plan

    def _begin(self, plan: Any) -> List[Optional[Entry]]:
        """The plan's sequences (None for an entry dropped since it was scheduled); records
        when each request was first scheduled."""
        n = int(plan.num_seqs)
        now = self._now = time.time()  # one clock read per step: its tokens arrive together
        owner = self.seq_owner
        entries: List[Optional[Entry]] = [
            owner.get(sid) if sid is not None else None for sid in list(plan.request_ids)[:n]
        ]
        context_lens = None
        for i, entry in enumerate(entries):
            if entry is not None and entry[0].metrics.first_scheduled_time is None:
                req = entry[0]
                req.metrics.first_scheduled_time = now
                # What the first step did not compute came from the prefix cache (vLLM's
                # num_cached_tokens, set once, at the first scheduling).
                if context_lens is None:
                    context_lens = plan.context_lens
                req.num_cached_tokens = int(context_lens[i])
        return entries

    def _execute(self, plan: Any, entries: List[Optional[Entry]]) -> torch.Tensor:
        if self.lora_admission is None:
            return self.runner.execute(plan)
        lora_ids = [e[0].lora_id if e is not None else 0 for e in entries]
        return self.runner.execute(plan, lora_ids=lora_ids)

    def _sample(
        self, plan: Any, entries: List[Optional[Entry]], hidden: torch.Tensor
    ) -> Tuple[StepSampling, torch.Tensor]:
        """Samples the step and applies what sampling decided before the scheduler hears of
        the tokens: which sample of an n > 1 group goes on under the scheduler's id, and the
        prompt logprobs."""
        work = StepSampling(
            self.runner.compute_logits,
            self.sampler,
            self.grammars,
            self._would_finish,
            self.max_num_seqs,
            plan,
            entries,
        )
        tokens = work.run(hidden)
        for i, parent in work.parents.items():
            entry = entries[i]
            assert entry is not None
            req, old = entry
            sched_id, old.sched_id = old.sched_id, None  # (the parent may be `old` itself)
            assert sched_id is not None
            parent.sched_id = sched_id
            self.seq_owner[sched_id] = (req, parent)
            entries[i] = (req, parent)
        for req, pos, d in work.prompt_logprobs:
            assert req.prompt_logprobs is not None and len(req.prompt_logprobs) == pos
            req.prompt_logprobs.append(d)
        return work, tokens

    def _would_finish(self, sched_id: str, token: int) -> bool:
        return self.scheduler.would_finish(sched_id, token) is not None

    # ------------------------------------------------------------------ update
    def _apply(
        self,
        entries: List[Optional[Entry]],
        tokens: np.ndarray,
        work: StepSampling,
        finished: List[Any],
        now: float,
        spec: Optional[Dict[int, List[int]]] = None,
    ) -> StepResult:
        """Appends the step's tokens to their sequences (and forks n > 1 samples); a sequence
        the scheduler finished gets its reason (with its last token). Skips sequences finished
        since the step was scheduled. ``spec``: the tokens of the speculating entries."""
        done = {f.request_id: f for f in finished}
        logprobs, forks = work.logprobs, work.forks
        updates: List[SeqUpdate] = []
        for i, tok in enumerate(tokens.tolist()):
            entry = entries[i]
            if tok < 0 or entry is None or entry[1].finished:
                continue
            req, seq = entry
            if forks and i in forks:  # before the parent can be finished by a stop string
                updates += self._fork_children(req, seq, forks[i], logprobs)
            lp = logprobs.get(id(seq)) if logprobs else None
            toks = spec.get(i) if spec else None
            if toks is None:
                updates.append(self._append(req, seq, tok, lp, done.get(seq.sched_id)))
                continue
            fin = done.get(seq.sched_id)
            for j, t in enumerate(toks):  # (a speculating sequence has no logprobs)
                updates.append(self._append(req, seq, t, None, fin if j == len(toks) - 1 else None))
        return StepResult(now, updates, [d for _, _, d in work.prompt_logprobs])

    def _fork_children(
        self,
        req: RequestState,
        parent: SeqState,
        kids: List[Tuple[SeqState, int]],
        logprobs: Dict[int, TokenLogprob],
    ) -> List[SeqUpdate]:
        req.forked = True
        out = []
        for seq, tok in kids:
            seq.sched_id = f"{req.request_id}#{seq.index}"
            assert parent.sched_id is not None
            # A child that finishes on its first token is freed at once by the scheduler.
            fin = self.scheduler.fork(parent.sched_id, seq.sched_id, tok)
            if fin is None:
                self.seq_owner[seq.sched_id] = (req, seq)
            out.append(self._append(req, seq, tok, logprobs.get(id(seq)), fin))
        return out

    def _append(
        self, req: RequestState, seq: SeqState, tok: int, lp: Optional[TokenLogprob], fin: Any
    ) -> SeqUpdate:
        seq.token_ids.append(tok)
        if lp is not None:
            if lp[0] is not None:
                seq.cumulative_logprob += lp[0]
            if seq.logprobs is not None and lp[1] is not None:
                seq.logprobs.append(lp[1])
        # The matcher takes every token before the next step's bitmask is filled from it.
        ended = seq.matcher is not None and advance(seq.matcher, tok)
        if fin is not None:
            seq.finish_reason, seq.stop_reason = fin.reason, fin.stop_token_id
            self.seq_owner.pop(seq.sched_id or "", None)
            if req.finished:
                self._release_lora(req)
        elif ended:
            # The grammar has ended (its stop token sampled with ignore_eos, or a stop token
            # the scheduler does not know): the sample is complete.
            seq.finish_reason, seq.stop_reason = "stop", None
            self.stop_sequence(req, seq)
        return SeqUpdate(req, seq, tok, lp, fin is not None)

    # ------------------------------------------------------------------ failure
    def fail_step(self) -> List[RequestState]:
        """Keeps the engine usable after a step raised (a bug, a value the sampler cannot
        take, Ctrl-C during LLM.generate), in the core or while its results were applied.
        The requests of the step are left half-stepped (tokens drawn but not applied, KV
        written or not, text half-updated), with no state to resume them from: they are
        aborted, freeing their blocks; the other requests go on. A plan not yet applied is
        then passed to update() with no tokens, which the scheduler requires before the next
        schedule(): it skips the entries aborted since, so this changes nothing else.
        Idempotent: the caller calls it again (step_failed) if it was itself interrupted.
        Returns the aborted requests (the caller forgets them)."""
        self._failed = True
        plan = self._plan
        reqs: Dict[int, RequestState] = {}
        for entry in self._step_entries:
            if entry is not None:
                reqs[id(entry[0])] = entry[0]
        plan_ids: List[str] = []
        if plan is not None:
            n = int(plan.num_seqs)
            plan_ids = [sid for sid in list(plan.request_ids)[:n] if sid is not None]
            for sid in plan_ids:
                owner = self.seq_owner.get(sid)
                if owner is not None:
                    reqs[id(owner[0])] = owner[0]
            # The requests swapped out by this plan are not in it: their KV must reach the
            # host blocks they resume from.
            self.runner.finish_swap_out(plan)
        for req in reqs.values():
            for seq in req.seqs:
                if seq.sched_id is not None:  # finished or not: Python may not have told it
                    self.scheduler.abort_request(seq.sched_id)
                    self.seq_owner.pop(seq.sched_id, None)
                if not seq.finished:
                    seq.finish_reason = "abort"
            self._release_lora(req)
        if plan is not None:
            for sid in plan_ids:  # any entry the engine did not know of
                self.scheduler.abort_request(sid)
            self.scheduler.update(plan, np.full(int(plan.num_seqs), -1, dtype=np.int64))
            self._plan = None
        self._step_entries, self._failed = [], False
        return list(reqs.values())
