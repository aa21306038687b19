"""LLMEngine: requests in, RequestOutputs out, one scheduler step at a time (vLLM's API).

One step, data flowing one way: Scheduler.schedule() -> StepPlan -> ModelRunner.execute()
(block swaps/copies, forward through the paged cache) -> logits of the rows to sample ->
Sampler -> Scheduler.update() (appends tokens, finishes on EOS / stop ids / max_tokens, frees
blocks) -> detokenizer and stop strings (finishing in the scheduler by abort) -> outputs.
n > 1 samples fork from the parent right after its prompt completes, sharing its prompt blocks.
"""

from __future__ import annotations

import logging
import time
import zlib
from typing import Any, Dict, Iterable, List, Optional, Union

import numpy as np

from pagedkv.engine.config import EngineConfig
from pagedkv.engine.detokenizer import IncrementalDetokenizer
from pagedkv.engine.direct_decoder import DirectDecoder
from pagedkv.engine.engine_setup import build_engine_parts
from pagedkv.engine.input_processor import EngineRequest, InputProcessor
from pagedkv.engine.outputs import RequestMetrics, RequestOutput
from pagedkv.engine.request_state import RequestState, SeqState
from pagedkv.engine.sampling_params import SamplingParams
from pagedkv.engine.spec_decode.config import SpeculativeConfig
from pagedkv.engine.spec_decode.speculator import Speculator, emitted_arrays
from pagedkv.engine.step_sampling import StepSampling
from pagedkv.engine.structured_output import GrammarCache, advance
from pagedkv.lora.admission import LoRAAdmission
from pagedkv.lora.request import LoRARequest

logger = logging.getLogger("pagedkv")


class LLMEngine:
    def __init__(
        self, model: Optional[str] = None, tokenizer: Optional[str] = None, **kwargs: Any
    ) -> None:
        self.config = EngineConfig.from_kwargs(model, tokenizer=tokenizer, **kwargs)
        parts = build_engine_parts(self.config)
        self.tokenizer = parts.tokenizer
        self.model_config = parts.model_config
        self.runner, self.scheduler, self.sampler = parts.runner, parts.scheduler, parts.sampler
        self.num_gpu_blocks, self.num_cpu_blocks = parts.num_blocks, parts.num_cpu_blocks
        self.eos_token_ids = parts.eos_token_ids
        self.input_processor = InputProcessor(
            self.tokenizer,
            self.model_config.vocab_size,
            self.model_config.max_model_len,
            self.config.max_logprobs,
            self.config.scheduling_policy,
        )
        self.decoder = DirectDecoder(self.tokenizer) if self.tokenizer is not None else None
        self.structured = (
            GrammarCache(self.tokenizer.hf, self.model_config.vocab_size, self.eos_token_ids)
            if self.tokenizer is not None
            else None
        )
        self.input_processor.grammars = self.structured
        self._token_text: Dict[int, str] = {}  # token id -> its text alone (logprob entries)
        self.requests: Dict[str, RequestState] = {}
        self.seq_owner: Dict[str, tuple[RequestState, SeqState]] = {}  # scheduler id -> seq
        self.stats = {"prompt_tokens": 0, "generation_tokens": 0}
        # The step under way (see _fail_step): its requests, and whether the scheduler has
        # had its update(); a failed step that could not finish failing waits in _failed_plan.
        self._step_entries: List[tuple[RequestState, SeqState]] = []
        self._plan_applied = True
        self._failed_plan: Any = None
        spec = SpeculativeConfig.from_dict(self.config.speculative_config)
        self.speculator = Speculator(spec, self.sampler) if spec is not None else None
        lora = getattr(self.runner, "lora", None)
        self.lora_admission = LoRAAdmission(self.config.max_loras) if lora is not None else None

    @classmethod
    def from_engine_args(cls, **kwargs: Any) -> LLMEngine:
        return cls(**kwargs)

    def get_tokenizer(self) -> Any:
        """The tokenizer (vLLM's LLMEngine.get_tokenizer); None with skip_tokenizer_init."""
        return self.tokenizer

    # ------------------------------------------------------------------ requests
    def add_request(
        self,
        request_id: str,
        prompt: Union[str, List[int], Dict[str, Any], EngineRequest, None],
        params: Optional[SamplingParams] = None,
        arrival_time: Optional[float] = None,
        *,
        prompt_token_ids: Optional[List[int]] = None,
        priority: int = 0,
        lora_request: Optional[LoRARequest] = None,
    ) -> None:
        """vLLM's signature: ``prompt`` is text, a list of token ids, or a dict with "prompt"
        and / or "prompt_token_ids" (TextPrompt / TokensPrompt); ``prompt_token_ids=`` is the
        older keyword and wins over what ``prompt`` holds. An EngineRequest (checked and
        tokenized off the engine thread by ``self.input_processor``) is taken as is.
        ``lora_request``: the adapter to run with (needs enable_lora); loaded here if new."""
        lora_id = self._load_lora(lora_request)
        if isinstance(prompt, EngineRequest):
            checked = prompt
        else:
            checked = self.input_processor.process(
                request_id,
                prompt,
                params,
                arrival_time,
                prompt_token_ids=prompt_token_ids,
                priority=priority,
            )
        if checked.request_id != request_id:
            raise ValueError(
                f"request_id {request_id!r} differs from the processed "
                f"request's {checked.request_id!r}"
            )
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        params = checked.params
        req = RequestState(
            request_id,
            checked.prompt,
            checked.prompt_token_ids,
            params,
            RequestMetrics(checked.arrival_time),
            checked.max_tokens,
            self.eos_token_ids,
            checked.bad_words_token_ids,
            lora_id=lora_id,
        )
        if params.prompt_logprobs is not None:
            req.prompt_logprobs = [None]
        req.grammar = checked.grammar
        for i in range(params.best_of):  # type: ignore[arg-type]
            gen = None
            if params.seed is not None:
                gen = self.sampler.make_generator(params.seed + 1_000_003 * i)
            req.seqs.append(
                SeqState(
                    index=i, generator=gen, logprobs=[] if params.logprobs is not None else None
                )
            )
            if req.grammar is not None:  # each sample follows the grammar on its own
                req.seqs[-1].matcher = self.structured.matcher(req.grammar)  # type: ignore
        self.requests[request_id] = req
        if self.lora_admission is None or self.lora_admission.admit(
            lora_id, request_id, (req, checked.priority)
        ):
            self._add_to_scheduler(req, checked.priority)

    def _load_lora(self, lora_request: Optional[LoRARequest]) -> int:
        if lora_request is None:
            return 0
        if not isinstance(lora_request, LoRARequest):
            raise TypeError(
                "lora_request must be a pagedkv.lora.LoRARequest, got "
                f"{type(lora_request).__name__}"
            )
        lora = getattr(self.runner, "lora", None)
        if lora is None:
            raise ValueError("lora_request needs an engine with enable_lora=True")
        lora.add_adapter(lora_request)
        return lora_request.lora_int_id

    def _release_lora(self, req: RequestState) -> None:
        """``req`` left the engine: its adapter's place may go to a waiting request."""
        if self.lora_admission is None or not req.lora_id:
            return
        if self.lora_admission.drop(req.request_id):
            return  # it never reached the scheduler
        for waiting, priority in self.lora_admission.release(req.lora_id):
            if waiting.request_id in self.requests:
                self._add_to_scheduler(waiting, priority)

    def _add_to_scheduler(self, req: RequestState, priority: int) -> None:
        p = req.params
        eos = req.eos_token_ids
        stop_ids = list(p.stop_token_ids or [])
        if not p.ignore_eos:
            stop_ids += eos[1:]  # the scheduler has one EOS slot; the others act as stop ids
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
            eos_token_id=eos[0] if eos else None,
            stop_token_ids=stop_ids,
            priority=priority,
            ignore_eos=p.ignore_eos,
            min_tokens=p.min_tokens,
            cache_salt=salt,
        )
        self.seq_owner[req.request_id] = (req, seq)

    def abort_request(self, request_id: Union[str, Iterable[str]]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            req = self.requests.pop(rid, None)
            if req is None:
                continue
            self._release_lora(req)
            for seq in req.seqs:
                if seq.sched_id is not None and not seq.finished:
                    self.scheduler.abort_request(seq.sched_id)
                self.seq_owner.pop(seq.sched_id or "", None)
                if not seq.finished:
                    seq.finish_reason = "abort"

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    # ------------------------------------------------------------------ one step
    def step(self) -> List[RequestOutput]:
        if self._failed_plan is not None:  # the last failed step was interrupted failing
            self._fail_step(self._failed_plan)
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
            return []
        self._step_entries, self._plan_applied = [], False
        try:
            return self._run_plan(plan)
        except BaseException as exc:
            self._failed_plan = plan
            failed = self._fail_step(plan)
            if failed:
                shown = ", ".join(failed[:8]) + (", ..." if len(failed) > 8 else "")
                logger.warning("a step failed (%r); its requests were aborted: %s", exc, shown)
                if hasattr(exc, "add_note"):  # Python >= 3.11
                    exc.add_note(f"pagedkv: the failed step's requests were aborted: {shown}")
            raise

    def _fail_step(self, plan: Any) -> List[str]:
        """Keeps the engine usable after a step raised (a bug, a value the sampler cannot
        take, Ctrl-C during LLM.generate). The requests the plan ran are left half-stepped
        (tokens drawn but not applied, KV written or not, text half-updated), with no state to
        resume them from: they are aborted, freeing their blocks; the other requests go on.
        A plan not yet applied is then passed to update() with no tokens, which is what the
        scheduler requires before the next schedule(): update() skips the entries aborted
        since schedule(), so this changes nothing else. Idempotent: step() calls it again if
        it was itself interrupted. Returns the aborted request ids."""
        n = int(plan.num_seqs)
        plan_ids = [sid for sid in list(plan.request_ids)[:n] if sid is not None]
        reqs = {id(r): r for r, _ in self._step_entries}
        for sid in plan_ids:
            owner = self.seq_owner.get(sid)
            if owner is not None:
                reqs[id(owner[0])] = owner[0]
        if not self._plan_applied:
            # The requests swapped out by this plan are not in it: their KV must reach the
            # host blocks they resume from.
            self.runner.finish_swap_out(plan)
        failed = []
        for req in reqs.values():
            for seq in req.seqs:
                if seq.sched_id is not None:  # finished or not: Python may not have told it
                    self.scheduler.abort_request(seq.sched_id)
                    self.seq_owner.pop(seq.sched_id, None)
                if not seq.finished:
                    seq.finish_reason = "abort"
            if self.requests.pop(req.request_id, None) is not None:
                failed.append(req.request_id)
                self._release_lora(req)
        if not self._plan_applied:
            for sid in plan_ids:  # any entry the engine did not know of
                self.scheduler.abort_request(sid)
            self.scheduler.update(plan, np.full(n, -1, dtype=np.int64))
            self._plan_applied = True
        self._step_entries, self._failed_plan = [], None
        return failed

    def _run_plan(self, plan: Any) -> List[RequestOutput]:
        n = int(plan.num_seqs)
        now = time.time()  # one clock read per step: its tokens all arrive together
        owner = self.seq_owner
        entries = self._step_entries = [owner[sid] for sid in list(plan.request_ids)[:n]]
        context_lens = None
        for i, (req, _) in enumerate(entries):
            if req.metrics.first_scheduled_time is None:
                req.metrics.first_scheduled_time = now
                # What the first step did not compute came from the prefix cache (vLLM's
                # num_cached_tokens, set once, at the first scheduling).
                if context_lens is None:
                    context_lens = plan.context_lens
                req.num_cached_tokens = int(context_lens[i])
        if self.lora_admission is not None:
            hidden = self.runner.execute(plan, lora_ids=[r.lora_id for r, _ in entries])
        else:
            hidden = self.runner.execute(plan)
        work = StepSampling(self, plan, entries)
        sampled = work.run(hidden)  # [n] int64, -1 where nothing was sampled
        spec: Dict[int, List[int]] = {}
        if self.speculator is not None and int(plan.num_draft_tokens_total):
            spec = self.speculator.verify(plan, hidden, work.entries, self.runner.compute_logits)
        if spec:
            tokens, counts = emitted_arrays(plan, sampled, spec)
            finished_ids = set(self.scheduler.update_accepted(plan, tokens, counts))
            # Emitted past a stop are dropped by the scheduler: show what it kept.
            for i, n_kept in enumerate(self.scheduler.num_appended):
                if i in spec:
                    spec[i] = spec[i][:n_kept]
        else:
            finished_ids = set(self.scheduler.update(plan, sampled))
        self._plan_applied = True
        logprobs, forks = work.logprobs, work.forks
        # Only requests with something to report: streaming ones, and those whose sample
        # finished (generate()'s final_only requests report once, at the end).
        touched: Dict[str, RequestState] = {}
        num_tokens = 0
        for i, tok in enumerate(sampled.tolist()):
            if tok < 0:
                continue
            req, seq = work.entries[i]
            if forks and i in forks:  # before the parent can be finished by a stop string
                num_tokens += self._fork_children(req, seq, forks[i], work, now)
            toks = spec.get(i, (tok,))
            for j, t in enumerate(toks):
                if seq.finished:  # a stop string ended it: the rest is not output
                    break
                self._accept_token(
                    req,
                    seq,
                    t,
                    logprobs.get(id(seq)) if logprobs else None,
                    j == len(toks) - 1 and seq.sched_id in finished_ids,
                    now,
                )
                num_tokens += 1
            if not req.final_only or seq.finish_reason is not None:
                touched[req.request_id] = req
        self.stats["generation_tokens"] += num_tokens
        if self.speculator is not None:
            self.speculator.propose(self.scheduler, work.entries)
        return self._collect_outputs(touched)

    def _fork_children(
        self,
        req: RequestState,
        parent: SeqState,
        kids: List[tuple[SeqState, int]],
        work: StepSampling,
        now: float,
    ) -> int:
        req.forked = True
        for seq, tok in kids:
            seq.sched_id = f"{req.request_id}#{seq.index}"
            if req.would_finish(1, tok):
                done = True  # finishes on its first token: it never needs blocks of its own
            else:
                done = bool(self.scheduler.fork(parent.sched_id, seq.sched_id, tok))
            if not done:
                self.seq_owner[seq.sched_id] = (req, seq)
            self._accept_token(req, seq, tok, work.logprobs.get(id(seq)), done, now)
        return len(kids)

    def _accept_token(
        self,
        req: RequestState,
        seq: SeqState,
        tok: int,
        lp: Optional[tuple[Optional[float], Optional[dict]]],
        sched_finished: bool,
        now: float,
    ) -> None:
        metrics = req.metrics
        if metrics.first_token_time is None:
            metrics.first_token_time = now
            self.stats["prompt_tokens"] += len(req.prompt_token_ids)
        metrics.last_token_time = now
        seq.token_ids.append(tok)
        if seq.matcher is not None and advance(seq.matcher, tok) and not sched_finished:
            # The grammar has ended (its stop token sampled with ignore_eos, or a stop token
            # the scheduler does not know): the sample is complete.
            self.scheduler.abort_request(seq.sched_id)
            seq.finish_reason, seq.stop_reason = "stop", None
            self.seq_owner.pop(seq.sched_id or "", None)
        if lp is not None:
            if lp[0] is not None:
                seq.cumulative_logprob += lp[0]
            if seq.logprobs is not None and lp[1] is not None:
                seq.logprobs.append(self.decode_logprob_tokens(lp[1]))
        if sched_finished:
            req.finish_by_scheduler(seq)
            self.seq_owner.pop(seq.sched_id or "", None)
        elif not req.incremental_text and not seq.finished:
            return  # the common running case: nothing to show or check yet
        # A stop token / EOS ends the text without being shown (vLLM's rule).
        hide = (
            sched_finished
            and seq.finish_reason == "stop"
            and not req.params.include_stop_str_in_output
        )
        if not req.incremental_text:
            if seq.finished and req.params.detokenize and self.decoder is not None:
                shown = seq.token_ids[:-1] if hide else seq.token_ids
                p = req.params
                seq.text = self.decoder.decode(
                    shown, p.skip_special_tokens, p.spaces_between_special_tokens
                )
            return
        delta = self._detokenize(req, seq, [] if hide else [tok])
        if req.check_stop_strings(seq, delta):
            if not sched_finished:
                self.scheduler.abort_request(seq.sched_id)
                self.seq_owner.pop(seq.sched_id or "", None)
        elif seq.finished:
            seq.text += seq.detok.flush()  # release a held-back partial character

    def _detokenize(self, req: RequestState, seq: SeqState, toks: List[int]) -> int:
        """Appends the tokens' text to the sample; returns how many characters it added."""
        if seq.detok is None:
            p = req.params
            seq.detok = IncrementalDetokenizer(
                self.decoder, p.skip_special_tokens, p.spaces_between_special_tokens
            )
        delta = seq.detok.append(toks)
        seq.text += delta
        return len(delta)

    def decode_logprob_tokens(self, d: dict) -> dict:
        if self.decoder is None:
            return d
        cache = self._token_text
        for tid, lp in d.items():
            text = cache.get(tid)
            if text is None:  # one decode per vocabulary entry, not per entry per step
                text = cache[tid] = self.decoder.decode([tid], skip_special_tokens=False)
            lp.decoded_token = text
        return d

    def _collect_outputs(self, touched: Dict[str, RequestState]) -> List[RequestOutput]:
        outs = []
        for req in touched.values():
            best_of = req.params.best_of or req.params.n  # set by SamplingParams.__post_init__
            if not req.finished and (req.final_only or best_of > req.params.n):
                continue  # best_of picks the winners at the end only
            outs.append(req.to_output())
            if req.finished and self.requests.pop(req.request_id, None) is not None:
                self._release_lora(req)
        return outs

    # ------------------------------------------------------------------ stats
    def get_stats(self) -> Dict[str, Any]:
        s = self.scheduler
        return {
            "num_requests_running": int(s.num_running),
            "num_requests_waiting": int(s.num_waiting) + int(s.num_swapped),
            "num_requests_swapped": int(s.num_swapped),
            "kv_cache_usage_perc": float(s.kv_cache_usage),
            "prefix_cache_queries": int(s.prefix_cache_query_tokens),
            "prefix_cache_hits": int(s.prefix_cache_hit_tokens),
            "num_preemptions": int(s.num_preemptions),
            "prompt_tokens": self.stats["prompt_tokens"],
            "generation_tokens": self.stats["generation_tokens"],
            "num_gpu_blocks": self.num_gpu_blocks,
            "num_free_blocks": int(s.num_free_blocks),
            **(self.speculator.metrics.as_stats() if self.speculator is not None else {}),
        }
