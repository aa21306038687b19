"""LLMEngine: requests in, RequestOutputs out, one step at a time (vLLM's API).

A thin composition of the pipeline's pieces, data flowing one way: the InputProcessor
(input_processor.py) validates and converts a prompt and its SamplingParams; add_request turns
that into a RequestState; the EngineCore (engine_core.py) runs a step: Scheduler.schedule() ->
StepPlan -> ModelRunner.execute() -> StepSampling -> Scheduler.update(), which appends the
tokens and decides which sequences finished and why; the OutputProcessor
(output_processor.py) detokenizes, applies stop strings and builds the RequestOutputs. The one
thing flowing back is the samples a stop string finished, which the core then stops in the
scheduler. n > 1 samples fork from the parent right after its prompt completes, sharing its
prompt blocks. With async_scheduling the core overlaps the host's work for the next step with
the device's current one (see engine_core.py).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Iterable, List, Optional, Union

from pagedkv.engine.config import EngineConfig
from pagedkv.engine.engine_core import EngineCore
from pagedkv.engine.engine_setup import build_engine_parts
from pagedkv.engine.input_processor import EngineRequest, InputProcessor
from pagedkv.engine.multimodal import image_input_processor
from pagedkv.engine.output_processor import OutputProcessor
from pagedkv.engine.outputs import RequestMetrics, RequestOutput
from pagedkv.engine.request_failures import RequestFailures
from pagedkv.engine.request_state import RequestState, SeqState
from pagedkv.engine.sampling_params import SamplingParams
from pagedkv.engine.spec_decode.config import SpeculativeConfig
from pagedkv.engine.spec_decode.speculator import Speculator
from pagedkv.engine.structured_output import GrammarCache
from pagedkv.lora.admission import LoRAAdmission
from pagedkv.lora.request import LoRARequest

logger = logging.getLogger("pagedkv")


class LLMEngine:
    def __init__(
        self,
        model: Optional[str] = None,
        tokenizer: Optional[str] = None,
        *,
        config: Optional[EngineConfig] = None,
        **kwargs: Any,
    ) -> None:
        """The engine of ``EngineConfig.from_kwargs(model, tokenizer=..., **kwargs)``, or of
        ``config`` when the caller has read it already (runner_choice.make_engine)."""
        if config is None:
            config = EngineConfig.from_kwargs(model, tokenizer=tokenizer, **kwargs)
        elif model is not None or tokenizer is not None or kwargs:
            raise TypeError("LLMEngine takes either config or engine arguments, not both")
        self.config = config
        parts = build_engine_parts(self.config)
        self.tokenizer = parts.tokenizer
        self.model_config = parts.model_config
        self.num_gpu_blocks, self.num_cpu_blocks = parts.num_blocks, parts.num_cpu_blocks
        self.eos_token_ids = parts.eos_token_ids
        self.input_processor = InputProcessor(
            self.tokenizer,
            self.model_config.vocab_size,
            self.model_config.max_model_len,
            self.config.max_logprobs,
            self.config.scheduling_policy,
        )
        self.structured = (
            GrammarCache(self.tokenizer.hf, self.model_config.vocab_size, self.eos_token_ids)
            if self.tokenizer is not None
            else None
        )
        self.input_processor.grammars = self.structured
        self.input_processor.architecture = self.model_config.hf_config.architecture
        self.input_processor.images = image_input_processor(
            parts.runner, self.model_config.hf_config, self.config.limit_mm_per_prompt
        )
        lora = getattr(parts.runner, "lora", None)
        self.core = EngineCore(
            parts.scheduler,
            parts.runner,
            parts.sampler,
            self.structured,
            self.config.max_num_seqs,
            LoRAAdmission(self.config.max_loras) if lora is not None else None,
            self.config.overlapped_steps,
            speculator=_speculator(self.config.speculative_config, parts.sampler, parts.runner),
        )
        self.output_processor = OutputProcessor(self.tokenizer)
        self._request_errors: Dict[str, Exception] = {}  # see take_request_errors

    # The pieces' state, by the names callers and tests have always used (read-only: a test
    # that swaps the scheduler or the sampler does it on the core).
    @property
    def scheduler(self) -> Any:
        return self.core.scheduler

    @property
    def runner(self) -> Any:
        return self.core.runner

    @property
    def sampler(self) -> Any:
        return self.core.sampler

    @property
    def lora_admission(self) -> Optional[LoRAAdmission]:
        return self.core.lora_admission

    @property
    def seq_owner(self) -> Dict[str, tuple[RequestState, SeqState]]:
        return self.core.seq_owner

    @property
    def requests(self) -> Dict[str, RequestState]:
        return self.output_processor.requests

    @property
    def decoder(self) -> Any:
        return self.output_processor.decoder

    @decoder.setter
    def decoder(self, decoder: Any) -> None:
        self.output_processor.decoder = decoder

    @property
    def stats(self) -> Dict[str, int]:
        return self.output_processor.stats

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
        if checked.mm is not None:  # the vision tower runs once, here, at admission
            checked.mm.embeds = self.runner.encode_images(checked.mm.encoder_inputs)
            req.mm = checked.mm
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
        self.core.add_request(req, checked.priority)
        self.output_processor.add_request(req)

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

    def abort_request(self, request_id: Union[str, Iterable[str]]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            req = self.requests.pop(rid, None)
            if req is not None:
                self.core.abort_request(req)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    # ------------------------------------------------------------------ one step
    def step(self) -> List[RequestOutput]:
        if self.core.step_failed:  # the last failed step was interrupted failing
            self._fail_step()
        try:
            result = self.core.step()
            if result is None:
                return []
            outputs, stopped = self.output_processor.process(result)
        except BaseException as exc:
            failed = self._fail_step()
            if failed:
                shown = ", ".join(failed[:8]) + (", ..." if len(failed) > 8 else "")
                logger.warning("a step failed (%r); its requests were aborted: %s", exc, shown)
                if hasattr(exc, "add_note"):  # Python >= 3.11
                    exc.add_note(f"pagedkv: the failed step's requests were aborted: {shown}")
            raise
        for req, seq in stopped:
            self.core.stop_sequence(req, seq)
        return outputs + self._fail_requests(result.failures)

    def _fail_requests(self, failures: RequestFailures) -> List[RequestOutput]:
        """Aborts the requests whose own work raised in the step (the others went on); their
        errors wait for take_request_errors(). Returns their final outputs (finish_reason
        "abort"), so that a caller waiting for them to finish is not left waiting."""
        outs: List[RequestOutput] = []
        for req, exc in failures.items():
            self.core.abort_request(req)
            self.output_processor.drop([req])
            self._request_errors[req.request_id] = exc
            logger.warning("request %r failed and was aborted: %r", req.request_id, exc)
            try:
                outs.append(req.to_output())
            except Exception:  # noqa: BLE001 - its error is already recorded
                logger.exception("request %r: no final output", req.request_id)
        return outs

    def take_request_errors(self) -> Dict[str, Exception]:
        """The errors of the requests that failed alone since the last call (request id ->
        the exception its own work raised: a logits processor, its grammar, the sampler on its
        row, detokenization); each such request was aborted and its final output returned."""
        errors, self._request_errors = self._request_errors, {}
        return errors

    def _fail_step(self) -> List[str]:
        """Aborts the requests of the failed step (EngineCore.fail_step) and forgets them;
        returns their ids."""
        return self.output_processor.drop(self.core.fail_step())

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
            **(self.core.speculator.metrics.as_stats() if self.core.speculator else {}),
        }


def _speculator(
    config: Optional[Dict[str, Any]], sampler: Any, runner: Any
) -> Optional[Speculator]:
    spec = SpeculativeConfig.from_dict(config)
    if spec is None:
        return None
    return Speculator(spec, sampler, getattr(runner, "draft", None))
