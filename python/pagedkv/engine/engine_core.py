"""EngineCore: schedule -> execute -> sample -> update, one step at a time (vLLM v1's core).

The core owns the device side of requests: their sequences in the scheduler (by scheduler id),
LoRA admission, the model runner (or the executor over several ranks) and the sampler. Each step
it hands back what happened to each sequence (a StepResult: tokens, their logprobs, which
sequences finished); turning that into text and RequestOutputs is the output processor's job.
Why a sequence finished is decided by the C++ scheduler only (EOS ids, stop ids, min_tokens,
max_tokens), and by a structured-output grammar reaching its end; stop *strings* need text, so
the output processor finds them and the core then stops the sequence (stop_sequence).

Overlapped (``async_scheduling=True``, vLLM's async scheduling, SGLang's overlap scheduler):
while the device runs step N, the host schedules step N+1 and launches its forward before step
N's tokens reach the host. Scheduler.advance() gives each sequence that step N sampled a
placeholder token; the runner fills the placeholders in on the device from step N's tokens.
Step N's tokens are then applied (Scheduler.resolve(); a sequence they finished was already
scheduled in N+1, and its row there is dropped) before step N+1 is sampled, so sampling sees
what the serial loop sees: penalties and logits processors read the up-to-date outputs, and a
grammar matcher accepts token t before the bitmask for t+1 is filled. No request kind needs the
serial step for that reason; what overlap hides is the scheduling, the step's metadata and the
forward's launch (and, in LLMEngine, the output processing of step N). step() returns step N's
results while step N+1 runs; the outputs are those of the serial loop.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set, Tuple, Union

import numpy as np
import torch

from pagedkv.engine.mrope_positions import step_mrope_positions
from pagedkv.engine.multimodal import step_image_rows
from pagedkv.engine.outputs import Logprob
from pagedkv.engine.request_failures import RequestFailures
from pagedkv.engine.request_state import RequestState, SeqState
from pagedkv.engine.sampler import Sampler
from pagedkv.engine.spec_decode.speculator import Speculator, emitted_arrays
from pagedkv.engine.step_sampling import Entry, StepSampling, TokenLogprob
from pagedkv.engine.structured_bitmask import StructuredBitmask
from pagedkv.engine.structured_output import GrammarCache
from pagedkv.lora.admission import LoRAAdmission

# One token appended to one sequence (already in seq.token_ids): (request, sequence, token,
# its logprobs or None, whether the scheduler finished the sequence with it: seq.finish_reason
# says why). A grammar that ended is not a scheduler finish (the token is shown, as in the
# serial engine before the split). A plain tuple: a batch-256 decode step builds 256 of them,
# and a dataclass's __init__ cost ~40 us of host time per step.
SeqUpdate = Tuple[RequestState, SeqState, int, Optional[TokenLogprob], bool]


@dataclass
class _InFlight:
    """A step launched and sampled on the device whose tokens the host has not applied."""

    entries: List[Optional[Entry]]
    tokens: torch.Tensor  # [num entries] int64 on the device, -1 where nothing was sampled
    host: Any  # the tokens on the host (numpy), or a pinned tensor being copied into
    copied: Any  # CUDA event of that copy, or None
    work: StepSampling
    now: float

    def host_tokens(self) -> np.ndarray:
        if self.copied is not None:
            self.copied.synchronize()
        return self.host.numpy() if isinstance(self.host, torch.Tensor) else self.host


@dataclass
class StepResult:
    """What one step did, in batch order (forked samples right after their parent's entry)."""

    now: float  # when the step was scheduled: its tokens all count as arriving then
    updates: List[SeqUpdate]
    # Prompt-logprob entries this step added (to req.prompt_logprobs), for their token texts.
    prompt_logprobs: List[Dict[int, Logprob]]
    # The requests whose own work raised (already aborted here), with their errors.
    failures: RequestFailures


class EngineCore:
    def __init__(
        self,
        scheduler: Any,
        runner: Any,
        sampler: Sampler,
        grammars: Optional[GrammarCache],
        max_num_seqs: int,
        lora_admission: Optional[LoRAAdmission] = None,
        async_scheduling: bool = False,
        speculator: Optional[Speculator] = None,
    ) -> None:
        self.scheduler, self.runner, self.sampler = scheduler, runner, sampler
        self.speculator = speculator  # speculative decoding (speculative_config)
        self.grammars, self.max_num_seqs = grammars, max_num_seqs
        # Structured outputs: the next step's bitmask is filled while the host does the rest.
        self.bitmask = StructuredBitmask(grammars, max_num_seqs) if grammars is not None else None
        self.lora_admission = lora_admission
        self.async_scheduling = async_scheduling
        self._lora_held: Set[str] = set()  # requests with an adapter, admitted or waiting
        self.seq_owner: Dict[str, Tuple[RequestState, SeqState]] = {}  # scheduler id -> seq
        # What a failed step must abort (see fail_step): the entries of the steps under way,
        # including the one whose results are being applied.
        self._step_entries: List[Optional[Entry]] = []
        self._plan: Any = None  # scheduled, not yet passed to update() / advance()
        self._inflight: Optional[_InFlight] = None  # overlapped: launched, not yet applied
        self._failed = False  # a failed step was interrupted while failing
        self._now = 0.0  # when the step under way was scheduled
        # the step's requests whose own work raised
        self._failures: RequestFailures[RequestState] = RequestFailures()

    # ------------------------------------------------------------------ requests
    def add_request(self, req: RequestState, priority: int) -> None:
        """Queues the request, or holds it until its LoRA adapter may be loaded."""
        if req.lora_id and self.lora_admission is not None:
            self._lora_held.add(req.request_id)
        if self.lora_admission is None or self.lora_admission.admit(
            req.lora_id, req.request_id, (req, priority)
        ):
            try:
                self._add_to_scheduler(req, priority)
            except BaseException:  # refused by the scheduler: its adapter place is free again
                self._release_lora(req)
                raise

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
        if req.mm is not None and p.prompt_logprobs is None:
            # Blocks holding image placeholders are shared only by prompts of the same images.
            salt = f"{req.mm.cache_salt}:{salt}"
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

    def set_async_scheduling(self, on: bool) -> None:
        """Switches between the serial and the overlapped loop while no request runs (a
        benchmark compares both on one engine). A step left in flight then holds only rows
        dropped since: it is resolved with no tokens."""
        if self.seq_owner:
            raise RuntimeError("set_async_scheduling: requests are running")
        if self._inflight is not None:
            self.scheduler.resolve(np.full(len(self._inflight.entries), -1, dtype=np.int64))
            self._inflight = None
        self.async_scheduling = bool(on)

    @property
    def step_failed(self) -> bool:
        """A step failed and fail_step() has not completed since."""
        return self._failed

    # ------------------------------------------------------------------ one step
    def step(self) -> Optional[StepResult]:
        """Runs one step; None when nothing ran (or, overlapped, nothing was applied yet).
        After it raised, fail_step() must run before the next step."""
        assert not self._failed, "fail_step() first"
        self._step_entries = []
        self._failures = RequestFailures()
        if self.async_scheduling:
            return self._with_failures(self._overlapped_step())
        plan = self._schedule()
        if plan is None:
            return None
        entries = self._step_entries = self._begin(plan)
        if self.speculator is not None:  # a draft model follows every step, writes drafts
            self.speculator.draft(plan, entries, self.seq_owner)
        hidden = self._execute(plan, entries)
        work, tokens = self._sample(plan, entries, hidden)
        host = work.host(tokens)
        spec: Dict[int, List[int]] = {}
        if self.speculator is not None and int(plan.num_draft_tokens_total):
            failed: RequestFailures[RequestState] = RequestFailures()
            spec = self.speculator.verify(plan, hidden, entries, self.runner.compute_logits, failed)
            for req, _ in failed.items():  # (its own knobs raised: it emits nothing)
                self.abort_request(req)
            self._failures.merge(failed)
        if spec:  # the speculating entries emit their verified tokens instead of one sample
            flat, counts = emitted_arrays(host, spec)
            finished = self.scheduler.update_accepted(plan, flat, counts)
            kept = self.scheduler.num_appended  # fewer where a finish came first
            spec = {i: toks[: kept[i]] for i, toks in spec.items()}
        else:
            finished = self.scheduler.update(plan, host)
        self._plan = None
        result = self._with_failures(self._apply(entries, host, work, finished, self._now, spec))
        if self.speculator is not None:
            self.speculator.propose(self.scheduler, entries)
        return result

    def _with_failures(self, result: Optional[StepResult]) -> Optional[StepResult]:
        """The step's result carrying every request failure found in it (the overlapped
        step's too: found while sampling the next step, reported at once)."""
        if result is None and not self._failures:
            return None
        if result is None:
            result = StepResult(self._now, [], [], self._failures)
        result.failures = self._failures
        return result

    def _overlapped_step(self) -> Optional[StepResult]:
        prev = self._inflight
        plan = self._schedule()
        if plan is None and prev is None:
            return None
        hidden = None
        launched: List[Optional[Entry]] = []
        if plan is not None:
            # Step N+1 goes to the device before step N's tokens come back.
            prev_tokens = prev.tokens if prev is not None else None
            launched = self._entries(plan)
            hidden = self._execute(plan, launched, prev_tokens)
        result = None
        if prev is not None:
            self._step_entries = list(prev.entries)
            host = prev.host_tokens()
            finished = self.scheduler.resolve(host)  # drops finished rows from plan N+1
            self._inflight = None
            result = self._apply(prev.entries, host, prev.work, finished, prev.now)
        if plan is not None:
            assert hidden is not None
            entries = self._begin(plan, launched)  # after resolve(): rows it dropped are None
            self._step_entries += entries
            work, tokens = self._sample(plan, entries, hidden)
            flight = self._in_flight(entries, work, tokens)
            self.scheduler.advance(plan)
            self._plan, self._inflight = None, flight
        return result

    def _in_flight(
        self, entries: List[Optional[Entry]], work: StepSampling, tokens: torch.Tensor
    ) -> _InFlight:
        if work.tokens is not None or tokens.device.type == "cpu":
            return _InFlight(entries, tokens, work.host(tokens), None, work, self._now)
        # The copy back starts now and is waited for only when the next step has launched.
        pinned = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        pinned.copy_(tokens, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return _InFlight(entries, tokens, pinned, event, work, self._now)

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
                if self.speculator is not None:  # a draft model's cache has the same blocks
                    self.speculator.draft(plan, [], self.seq_owner)
            return None
        self._plan = plan
        return plan

    def _entries(
        self, plan: Any, known: Optional[List[Optional[Entry]]] = None
    ) -> List[Optional[Entry]]:
        """The plan's sequences (None for an entry dropped since it was scheduled). ``known``:
        this plan's entries read before; only its rows dropped since (the scheduler's slot -1:
        finished by resolve(), aborted) have changed, so they alone become None."""
        ids = list(plan.request_ids)[: int(plan.num_seqs)]
        if known is not None:
            if None not in ids:
                return list(known)
            return [None if sid is None else e for sid, e in zip(ids, known)]
        owner = self.seq_owner
        return [owner.get(sid) if sid is not None else None for sid in ids]

    def _begin(
        self, plan: Any, known: Optional[List[Optional[Entry]]] = None
    ) -> List[Optional[Entry]]:
        """The plan's sequences (see _entries); records when each request was first scheduled."""
        now = self._now = time.time()  # one clock read per step: its tokens arrive together
        entries = self._entries(plan, known)
        # A request is first scheduled from the waiting queue, with (a chunk of) its prompt:
        # a prefill row, and those come first in the plan. Decode rows need no look.
        num_prefills = int(plan.num_prefills)
        context_lens = plan.context_lens if num_prefills else ()
        for i in range(num_prefills):
            entry = entries[i]
            if entry is not None and entry[0].metrics.first_scheduled_time is None:
                req = entry[0]
                req.metrics.first_scheduled_time = now
                # What the first step did not compute came from the prefix cache (vLLM's
                # num_cached_tokens, set once, at the first scheduling).
                req.num_cached_tokens = int(context_lens[i])
        return entries

    def _execute(
        self,
        plan: Any,
        entries: List[Optional[Entry]],
        prev_tokens: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        kw: Dict[str, Any] = {}
        if prev_tokens is not None:  # (over several ranks: the executor broadcasts them)
            kw["prev_tokens"] = prev_tokens
        if self.lora_admission is not None:
            self._read_adapters(entries)
            kw["lora_ids"] = [e[0].lora_id if e is not None else 0 for e in entries]
        if getattr(self.runner, "takes_images", False) and int(plan.num_prefills):
            kw["image_rows"] = step_image_rows(plan, entries)
        if getattr(self.runner, "uses_mrope", False):
            kw["mrope_positions"] = step_mrope_positions(plan, entries)
        return self.runner.execute(plan, **kw)

    def _read_adapters(self, entries: List[Optional[Entry]]) -> None:
        """Reads the step's adapters that are in neither host memory nor a device slot; the
        requests of one that cannot be read (its folder deleted or unreadable since it was
        added) fail alone and leave the step: their entries become None (rows without an
        adapter, whose tokens nobody takes)."""
        lora = getattr(self.runner, "lora", None)
        if lora is None:
            return
        wanted = sorted({e[0].lora_id for e in entries if e is not None and e[0].lora_id})
        errors = lora.ensure_readable(wanted) if wanted else {}
        if not errors:
            return
        for i, entry in enumerate(entries):
            if entry is not None and entry[0].lora_id in errors:
                req = entry[0]
                entries[i] = None
                if req not in self._failures:
                    self._failures.blame(req, errors[req.lora_id])
                    self.abort_request(req)

    def _sample(
        self, plan: Any, entries: List[Optional[Entry]], hidden: torch.Tensor
    ) -> Tuple[StepSampling, torch.Tensor]:
        """Samples the step and applies what sampling decided before the scheduler hears of
        the tokens: which sample of an n > 1 group goes on under the scheduler's id, and the
        prompt logprobs."""
        work = StepSampling(
            self.runner.compute_logits,
            self.sampler,
            self.bitmask,
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
        # A request whose own work raised leaves the step before the scheduler hears of its
        # rows (their entries are dropped from the plan: they drew nothing).
        for req, _ in work.failures.items():
            self.abort_request(req)
        self._failures.merge(work.failures)
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
        failures = self._failures
        failed = failures.request_ids  # (live: _append's matcher guard may add to it)
        bitmask = self.bitmask
        if bitmask is not None:
            bitmask.drop_queued()
        if work.logprobs or work.forks or spec or bitmask is not None:
            updates = self._updates(entries, tokens, work, done, spec or {})
        else:
            updates = self._plain_updates(entries, tokens, done)
        if bitmask is not None:  # the matchers take the step's tokens, in one call
            for req, exc in bitmask.accept_queued():
                with failures.guard(req):  # (a refused token: sampled outside the bitmask)
                    raise exc
        for req, _ in failures.items():  # (a matcher that raised: the others were aborted)
            self.abort_request(req)
        kept = [u for u in updates if u[0].request_id not in failed] if failures else updates
        if bitmask is not None:  # tokens taken and the next bitmask filled while the host goes on
            bitmask.prefetch([u[1] for u in kept])
        return StepResult(now, kept, [d for _, _, d in work.prompt_logprobs], failures)

    def _plain_updates(
        self, entries: List[Optional[Entry]], tokens: np.ndarray, done: Dict[str, Any]
    ) -> List[SeqUpdate]:
        """_updates for a step with no logprobs, forks, drafts or grammars (the common decode
        step): one token per entry, appended inline unless the scheduler finished its sequence
        (about half _updates' time per token on a batch-256 decode)."""
        updates: List[SeqUpdate] = []
        failed = self._failures.request_ids
        for entry, tok in zip(entries, tokens.tolist()):
            if tok < 0 or entry is None:
                continue
            req, seq = entry
            if seq.finish_reason is not None or req.request_id in failed:
                continue
            fin = done.get(seq.sched_id) if done else None  # type: ignore[arg-type]
            if fin is None:
                seq.token_ids.append(tok)
                updates.append((req, seq, tok, None, False))
            else:
                updates.append(self._append(req, seq, tok, None, fin))
        return updates

    def _updates(
        self,
        entries: List[Optional[Entry]],
        tokens: np.ndarray,
        work: StepSampling,
        done: Dict[str, Any],
        spec: Dict[int, List[int]],
    ) -> List[SeqUpdate]:
        """The step's tokens appended to their sequences, n > 1 samples forked, logprobs
        recorded, constrained tokens queued for their matchers, a speculating entry's tokens
        (``spec``) appended in turn."""
        logprobs, forks = work.logprobs, work.forks
        updates: List[SeqUpdate] = []
        failed = self._failures.request_ids
        bitmask = self.bitmask
        stops = bitmask.grammars.stop_token_ids if bitmask is not None else ()
        for i, tok in enumerate(tokens.tolist()):
            entry = entries[i]
            if tok < 0 or entry is None:
                continue
            req, seq = entry
            if seq.finish_reason is not None or req.request_id in failed:
                continue
            if forks and i in forks:  # before the parent can be finished by a stop string
                updates += self._fork_children(req, seq, forks[i], logprobs)
            lp = logprobs.get(id(seq)) if logprobs else None
            toks = spec.get(i) if spec else None
            if toks is None:
                fin = done.get(seq.sched_id) if done else None  # type: ignore[arg-type]
                if lp is None and fin is None and (seq.matcher is None or tok not in stops):
                    # The common decode token (what _append does with nothing to record): no
                    # call per sequence per step on a batch-256 decode.
                    seq.token_ids.append(tok)
                    if seq.matcher is not None:  # (a constrained one, that does not end it)
                        bitmask.accept_later(req, seq, tok)  # type: ignore[union-attr]
                    updates.append((req, seq, tok, None, False))
                else:
                    updates.append(self._append(req, seq, tok, lp, fin))
                continue
            fin = done.get(seq.sched_id)  # type: ignore[arg-type]
            for j, t in enumerate(toks):  # (a speculating sequence has no logprobs)
                updates.append(self._append(req, seq, t, None, fin if j == len(toks) - 1 else None))
        return updates

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
        # The matcher takes every token before the next step's bitmask is filled from it (all
        # the step's tokens in one call, at the end of _apply); a token that ends the grammar
        # is one of its stop tokens.
        ended = False
        if seq.matcher is not None:
            assert self.bitmask is not None
            ended = self.bitmask.accept_later(req, seq, tok)
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
        return (req, seq, tok, lp, fin is not None)

    # ------------------------------------------------------------------ failure
    def fail_step(self) -> List[RequestState]:
        """Keeps the engine usable after a step raised (a bug, a value the sampler cannot
        take, Ctrl-C during LLM.generate), in the core or while its results were applied.
        The requests of the steps under way are left half-stepped (tokens drawn but not
        applied, KV written or not, text half-updated), with no state to resume them from:
        they are aborted, freeing their blocks; the other requests go on. A plan not yet
        applied is then passed to the scheduler with no tokens, which it requires before the
        next schedule(): it skips the entries aborted since, so this changes nothing else.
        Idempotent: the caller calls it again (step_failed) if it was itself interrupted.
        Returns the aborted requests (the caller forgets them)."""
        self._failed = True
        plan, inflight = self._plan, self._inflight
        reqs: Dict[int, RequestState] = {}
        entries = list(self._step_entries) + (list(inflight.entries) if inflight else [])
        for entry in entries:
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
        for sid in plan_ids:  # any entry the engine did not know of
            self.scheduler.abort_request(sid)
        if self.scheduler.has_unresolved_step:  # every entry aborted: no token is read
            n_prev = len(inflight.entries) if inflight is not None else 0
            self.scheduler.resolve(np.full(n_prev, -1, dtype=np.int64))
        self._inflight = None
        if plan is not None:
            self.scheduler.update(plan, np.full(int(plan.num_seqs), -1, dtype=np.int64))
            self._plan = None
        self._step_entries, self._failed = [], False
        return list(reqs.values())
