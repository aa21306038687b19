"""vLLM's ``use_beam_search`` on /v1/completions and /v1/chat/completions (not streamed).

The beam width is ``best_of`` when given, else ``n`` (vLLM's meaning of both), and the answer
holds the ``n`` best hypotheses. Beam search ranks by the raw model logprobs and decodes no
other way, so a request that sets a sampling knob beam search would ignore (top_p, stop, a
logit bias, ...) gets a 400 naming it, as does ``stream``: the hypotheses are known only at the
end. A beam search runs as a "stream" with a single, final RequestOutput, so the endpoints'
answer building (echo, usage, token ids, metrics) is the same as for sampling.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable, Dict, List, Optional

from pagedkv.engine.beam_search import (
    BeamSearchOutput,
    BeamSearchParams,
    beam_search_async,
    check_width,
    num_candidates,
    step_params,
)
from pagedkv.engine.outputs import CompletionOutput, RequestOutput
from pagedkv.entrypoints.openai.errors import bad_request, field_named_in
from pagedkv.entrypoints.openai.request_checks import is_unset, text_format
from pagedkv.entrypoints.openai.structured_request import structured_outputs_of


def _default(value: Any, *defaults: Any) -> bool:
    return value is None or value in defaults


# Request fields beam search does not apply -> "this value is harmless" (unset or default).
_NOT_WITH_BEAMS: Dict[str, Callable[[Any], bool]] = {
    "stream": lambda v: not v,
    "top_p": lambda v: _default(v, 1.0),
    "top_k": lambda v: _default(v, 0, -1),
    "min_p": lambda v: _default(v, 0.0),
    "presence_penalty": lambda v: _default(v, 0.0),
    "frequency_penalty": lambda v: _default(v, 0.0),
    "repetition_penalty": lambda v: _default(v, 1.0),
    "stop": is_unset,
    "stop_token_ids": is_unset,
    "min_tokens": lambda v: not v,
    "logit_bias": is_unset,
    "allowed_token_ids": is_unset,
    "bad_words": is_unset,
    "logprobs": lambda v: v is None or v is False,  # completions: a count; chat: a flag
    "prompt_logprobs": lambda v: v is None,
    "response_format": text_format,
}


def beam_search_params(
    req: Any, max_tokens: int, max_logprobs: int, num_eos: int
) -> BeamSearchParams:
    """The BeamSearchParams of a use_beam_search request; a 400 naming the field for what
    beam search cannot honour."""
    for name, harmless in _NOT_WITH_BEAMS.items():
        if not harmless(getattr(req, name, None)):
            raise bad_request(f"{name} is not supported with use_beam_search", param=name)
    if structured_outputs_of(req) is not None:
        raise bad_request(
            "structured outputs are not supported with use_beam_search", param="use_beam_search"
        )
    width = req.best_of if req.best_of is not None else req.n
    width_field = "best_of" if req.best_of is not None else "n"
    if req.n > width:
        raise bad_request(
            f"n ({req.n}) must be at most the beam width (best_of = {width})", param="n"
        )
    fields = {"beam_width": width_field, "temperature": "temperature"}
    fields.update(length_penalty="length_penalty", max_tokens="max_tokens")
    try:
        params = BeamSearchParams(
            beam_width=width,
            max_tokens=max_tokens,
            ignore_eos=bool(req.ignore_eos),
            temperature=req.temperature or 0.0,
            length_penalty=req.length_penalty,
            include_stop_str_in_output=bool(req.include_stop_str_in_output),
        )
        check_width(params, num_eos, max_logprobs)
    except (TypeError, ValueError) as exc:
        raise bad_request(str(exc), param=field_named_in(str(exc), fields)) from exc
    return params


class BeamSearchStream:
    """One prompt's beam search, started at once (the prompts of a request search
    concurrently), read like an engine stream: one final RequestOutput with the ``n`` best
    hypotheses. ``close()`` before the end cancels it (its step's requests are aborted)."""

    def __init__(
        self,
        engine: Any,
        request_id: str,
        ids: List[int],
        text: Optional[str],
        params: BeamSearchParams,
        n: int,
        decode: Callable[[List[int]], str],
        lora_request: Any = None,
        priority: int = 0,
    ) -> None:
        self.request_id, self.ids, self.text, self.n = request_id, ids, text, n
        self._task = asyncio.ensure_future(
            beam_search_async(engine, request_id, ids, params, lora_request, decode, priority)
        )

    async def __aiter__(self) -> Any:
        yield self._output(await self._task)

    def close(self) -> None:
        if not self._task.done():
            self._task.cancel()

    def _output(self, result: BeamSearchOutput) -> RequestOutput:
        outputs = [
            CompletionOutput(
                index=i,
                text=seq.text or "",
                token_ids=seq.generated_token_ids,
                cumulative_logprob=seq.cum_logprob,
                logprobs=None,
                finish_reason=seq.finish_reason,
            )
            for i, seq in enumerate(result.sequences[: self.n])
        ]
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.text,
            prompt_token_ids=self.ids,
            prompt_logprobs=None,
            outputs=outputs,
            finished=True,
        )


def beam_jobs(
    serving: Any,
    req: Any,
    prompts: List[tuple],
    requested: Optional[int],
    length_field: str = "max_tokens",
    prompt_param: str = "prompt",
) -> Optional[List[tuple]]:
    """(token ids, text, BeamSearchParams) per (token ids, text) prompt, or None when the
    request does not ask for beam search. max_tokens as for sampling: what the context leaves
    when unset, capped by the model's generation_config max_new_tokens then (vLLM's rule)."""
    if not getattr(req, "use_beam_search", False):
        if req.length_penalty != 1.0:
            raise bad_request(
                "length_penalty applies to beam search only (set use_beam_search: true)",
                param="length_penalty",
            )
        return None
    engine = serving.engine
    processor = getattr(engine, "input_processor", None)
    cap = processor.max_logprobs if processor is not None else serving.state.max_logprobs
    num_eos = len(engine.engine.eos_token_ids)
    defaults = getattr(getattr(engine, "model_config", None), "generation_defaults", None) or {}
    jobs = []
    for ids, text in prompts:
        max_tokens = serving.max_tokens_for(len(ids), requested, length_field, prompt_param)
        if requested is None and defaults.get("max_tokens") is not None:
            max_tokens = min(max_tokens, int(defaults["max_tokens"]))
        params = beam_search_params(req, max_tokens, cap, num_eos)
        if processor is not None:
            # The beams' requests are checked again in the engine, past the point where an
            # error can still be a 400: what they share (prompt, priority, limits) is checked
            # here, once, as the first step's request.
            first = step_params(num_candidates(params, num_eos))
            try:
                processor.process(
                    "beam-check",
                    None,
                    first,
                    prompt_token_ids=ids,
                    priority=req.priority,
                    limits=serving.state.limits,
                )
            except (ValueError, TypeError) as exc:
                raise serving._as_400(exc, prompt_param) from exc
        jobs.append((ids, text, params))
    return jobs


def start_beam_searches(
    serving: Any, base_id: str, jobs: List[tuple], req: Any
) -> List[BeamSearchStream]:
    """A BeamSearchStream per (token ids, text, BeamSearchParams) job, with the request's
    adapter, priority and special-token rules for the text."""
    state = serving.state
    lora = state.lora.get(req.model) if state.lora is not None else None
    decode = functools.partial(
        serving.tokenizer.decode,
        skip_special_tokens=bool(req.skip_special_tokens),
        spaces_between_special_tokens=bool(req.spaces_between_special_tokens),
    )
    return [
        BeamSearchStream(
            serving.engine,
            base_id if len(jobs) == 1 else f"{base_id}-{i}",
            list(ids),
            text,
            params,
            req.n,
            decode,
            lora,
            req.priority,
        )
        for i, (ids, text, params) in enumerate(jobs)
    ]
