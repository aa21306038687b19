"""OpenAIServing: what the completion and chat handlers share, composed of one part per
concern (request_checks.py, serving_tokens.py, streaming.py); this file holds the server's
state and how a checked request enters the engine (ids, the InputProcessor, logs)."""

from __future__ import annotations

import functools
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence

from fastapi import Request

from pagedkv.engine.input_processor import (
    MAX_CLIENT_REQUEST_ID_CHARS,
    RequestLimits,
    check_request_id,
)
from pagedkv.entrypoints.openai.errors import APIError, bad_request, field_named_in
from pagedkv.entrypoints.openai.metrics import ServerMetrics
from pagedkv.entrypoints.openai.protocol import random_id
from pagedkv.entrypoints.openai.request_checks import (
    _SAMPLING_FIELDS,
    MAX_LOGPROBS,
    RequestChecks,
)
from pagedkv.entrypoints.openai.serving_tokens import TokenizerWork
from pagedkv.entrypoints.openai.streaming import ResponseStreams

logger = logging.getLogger("pagedkv.server")


@dataclass
class ServerState:
    """Everything a handler needs, built once per app."""

    engine: Any  # AsyncLLMEngine
    served_model_names: List[str]  # the first one is reported in responses
    model_aliases: List[str]  # other names accepted in requests (model path, ...)
    max_model_len: int
    chat_template: Optional[str]
    metrics: ServerMetrics
    limits: RequestLimits = field(default_factory=RequestLimits)  # --max-* (limits.py)
    response_role: str = "assistant"  # --response-role
    max_logprobs: int = MAX_LOGPROBS  # the engine's cap (--max-logprobs; -1 resolved)
    trust_request_chat_template: bool = False  # --trust-request-chat-template
    # --allowed-media-domains: hosts whose http(s) image URLs the server may fetch
    allowed_media_domains: Optional[List[str]] = None
    # --allowed-local-media-path (an engine setting, as in vLLM): the directory whose files
    # file:// image URLs may name
    allowed_local_media_path: Optional[str] = None
    # --enable-auto-tool-choice + --tool-call-parser: tool_choice "auto" (tool_calls.py)
    tool_call_parser: Optional[str] = None
    reasoning_parser: Optional[str] = None  # --reasoning-parser
    lora: Any = None  # serving_lora.LoRARegistry: adapters a request's model may name
    started: float = field(default_factory=time.time)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]


class OpenAIServing(RequestChecks, TokenizerWork, ResponseStreams):
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.engine = state.engine
        self.init_tokenizer_work(state.engine.tokenizer, state.max_model_len)

    @staticmethod
    def request_ids(raw: Request, req: Any, prefix: str) -> tuple[str, str]:
        """(response id, engine request id). vLLM's rule for the response id: ``prefix-`` +
        the X-Request-Id header, else the body's request_id, else a random uuid. A client's
        id need not be unique (retries, a fixed id), so the engine's id gets a random suffix:
        two requests with one id both run, and each aborts only itself."""
        header = raw.headers.get("x-request-id")
        given = header or getattr(req, "request_id", None)
        if given:
            try:  # logged and echoed in a header: no control characters (log forging, CR/LF)
                check_request_id(
                    given, "X-Request-Id" if header else "request_id", MAX_CLIENT_REQUEST_ID_CHARS
                )
            except ValueError as exc:
                raise bad_request(str(exc), param=None if header else "request_id") from None
        rid = f"{prefix}-{given}" if given else random_id(prefix)
        raw.state.request_id = rid  # for --enable-request-id-headers (api_server.py)
        return rid, f"{rid}-{uuid.uuid4().hex[:8]}" if given else rid

    async def start(
        self,
        request_id: str,
        ids: List[int],
        prompt: Optional[str],
        params: Any,
        priority: int = 0,
        prompt_param: str = "prompt",
        model: Optional[str] = None,
    ) -> Any:
        """Checks the request (the engine's InputProcessor, with this server's limits) in the
        tokenizer thread, where its bad words are tokenized too, then hands it to the engine
        loop, which only adds it. A ValueError of either (a TypeError of the checks) is the
        request's fault, a 400; anything else the engine raises is the server's failure: the
        app's handler answers 500 in JSON (errors.py)."""
        processor = getattr(self.engine, "input_processor", None)
        if processor is not None:
            try:
                prompt = await self.in_tokenizer_thread(
                    functools.partial(
                        processor.process,
                        request_id,
                        prompt,
                        params,
                        prompt_token_ids=ids,
                        priority=priority,
                        limits=self.state.limits,
                    )
                )
            except (ValueError, TypeError) as exc:
                raise self._as_400(exc, prompt_param) from exc
            ids = None  # type: ignore[assignment]
        try:
            lora = self.state.lora.get(model) if self.state.lora is not None else None
            kw = {"lora_request": lora} if lora is not None else {}
            return await self.engine.add_request(
                request_id, prompt, params, prompt_token_ids=ids, priority=priority, **kw
            )
        except ValueError as exc:
            raise self._as_400(exc, prompt_param) from exc

    def response_model(self, model: Optional[str]) -> str:
        """The model a response names: the LoRA adapter the request named (vLLM), else the
        first served name."""
        lora = self.state.lora
        return (
            model
            if model and lora is not None and lora.get(model) is not None
            else self.state.model_name
        )

    def stream_head(self, req: Any, request_id: str, obj: str) -> tuple[dict, bool, bool]:
        """A streamed response's (chunk base, include_usage, continuous): what every chunk
        carries (id, ``obj``, created, model), whether a usage chunk ends the stream
        (stream_options.include_usage) and whether every chunk carries usage too
        (continuous_usage_stats, only with include_usage)."""
        base = {
            "id": request_id,
            "object": obj,
            "created": int(time.time()),
            "model": self.response_model(req.model),
        }
        opts = req.stream_options
        include_usage = bool(opts and opts.include_usage)
        continuous = include_usage and bool(opts and opts.continuous_usage_stats)
        return base, include_usage, continuous

    @staticmethod
    def _as_400(exc: Exception, prompt_param: str) -> APIError:
        """The InputProcessor's / engine's error as a 400 naming the request field its
        message starts with."""
        names = {
            "prompt": prompt_param,
            "prompt_token_ids": prompt_param,
            "max_tokens": "max_tokens",
            "priority": "priority",
            "logit_bias": "logit_bias",
            **{f: f for f in _SAMPLING_FIELDS},
        }
        param = field_named_in(str(exc), names)
        if param is None and "priority" in str(exc).lower():
            param = "priority"  # vLLM: "Got priority 5 but Priority scheduling is not ..."
        if param is None and "logprobs" in str(exc):
            param = "logprobs"  # "Requested sample logprobs of 25, which is greater ..."
        return bad_request(str(exc), param=param)

    async def start_all(
        self,
        base_id: str,
        prompts: List[tuple],
        priority: int = 0,
        prompt_param: str = "prompt",
        model: Optional[str] = None,
    ) -> List[Any]:
        """Adds every (ids, text, params) prompt; on any rejection aborts those already added."""
        streams: List[Any] = []
        try:
            for i, (ids, text, params) in enumerate(prompts):
                rid = base_id if len(prompts) == 1 else f"{base_id}-{i}"
                streams.append(
                    await self.start(rid, ids, text, params, priority, prompt_param, model)
                )
        except BaseException:
            for s in streams:
                s.close()
            raise
        return streams

    def log_request(
        self, request_id: str, prompt_lens: Sequence[int], params: Any, stream: bool
    ) -> None:
        logger.info(
            "request %s: prompt_tokens=%s n=%s max_tokens=%s temperature=%s stream=%s",
            request_id,
            list(prompt_lens),
            getattr(params, "n", 1),
            getattr(params, "max_tokens", None),
            getattr(params, "temperature", None),
            stream,
        )
