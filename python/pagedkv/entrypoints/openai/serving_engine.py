"""What the completion and chat handlers share: model names, tokenization, length checks,
SamplingParams from a request, logprob formatting, client-disconnect handling, request logs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Dict, List, Optional, Sequence, TypeVar

from fastapi import Request

from pagedkv.entrypoints.openai.errors import APIError, bad_request, field_named_in
from pagedkv.entrypoints.openai.limits import DEFAULT_MAX_N_SEQUENCES, MAX_N_ENV
from pagedkv.entrypoints.openai.metrics import ServerMetrics
from pagedkv.entrypoints.openai.protocol import DONE, UsageInfo, chunk

logger = logging.getLogger("pagedkv.server")
T = TypeVar("T")

# Request fields passed to SamplingParams under the same name when the client set them.
_SAMPLING_FIELDS = ("n", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
                    "frequency_penalty", "repetition_penalty", "seed", "stop", "stop_token_ids",
                    "ignore_eos", "min_tokens", "skip_special_tokens")


@dataclass
class ServerState:
    """Everything a handler needs, built once per app."""

    engine: Any                      # AsyncLLMEngine
    served_model_names: List[str]    # the first one is reported in responses
    model_aliases: List[str]         # other names accepted in requests (model path, ...)
    max_model_len: int
    chat_template: Optional[str]
    metrics: ServerMetrics
    max_n_sequences: int = DEFAULT_MAX_N_SEQUENCES
    started: float = field(default_factory=time.time)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]


class OpenAIServing:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.engine = state.engine
        self.tokenizer = state.engine.tokenizer

    # ---------------------------------------------------------------- request checks

    def check_model(self, model: Optional[str]) -> None:
        if model in (None, "") or model in self.state.served_model_names:
            return
        if model.lower() in {a.lower() for a in self.state.model_aliases}:
            return
        raise APIError(404, f"The model `{model}` does not exist. Served models: "
                            f"{', '.join(self.state.served_model_names)}",
                       param="model", code="model_not_found")

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        try:
            return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))
        except TypeError:  # a tokenizer without the keyword
            return list(self.tokenizer.encode(text))

    def decode_token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def check_ids(self, ids: Sequence[int], param: str) -> None:
        if not ids:
            raise bad_request("the prompt is empty", param=param)
        vocab = getattr(self.tokenizer, "vocab_size", None)
        bad = [t for t in ids if t < 0 or (vocab is not None and t >= vocab)]
        if bad:
            raise bad_request(f"token id {bad[0]} is out of range [0, {vocab})", param=param)

    def check_n(self, n: int) -> None:
        """`n` is an int (pydantic checked that) in [1, the server's limit]."""
        if n < 1:
            raise bad_request(f"n must be at least 1, got {n}", param="n")
        limit = self.state.max_n_sequences
        if n > limit:
            raise bad_request(f"n must be at most {limit}, got {n}. To increase this limit, "
                              f"set the {MAX_N_ENV} environment variable.", param="n")

    def max_tokens_for(self, prompt_len: int, requested: Optional[int],
                       param: str = "max_tokens", prompt_param: str = "prompt") -> int:
        """vLLM's rule: prompt + completion must fit the context; no max_tokens = the rest.
        ``param`` / ``prompt_param``: the request fields errors name."""
        limit = self.state.max_model_len
        if requested is not None and requested < 1:
            raise bad_request(f"{param} must be at least 1, got {requested}", param=param)
        if prompt_len >= limit or (requested is not None and prompt_len + requested > limit):
            asked = prompt_len + (requested or 0)
            raise bad_request(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {asked} tokens ({prompt_len} in the prompt, {requested or 0} in "
                "the completion). Please reduce the length of the prompt or completion.",
                param=param if prompt_len < limit else prompt_param)
        return requested if requested is not None else limit - prompt_len

    def sampling_params(self, req: Any, max_tokens: int, logprobs: Optional[int],
                        prompt_logprobs: Optional[int] = None,
                        fields: Optional[Dict[str, str]] = None) -> Any:
        """SamplingParams of one prompt. ``fields`` maps a SamplingParams argument to the
        request field it came from where the two differ (chat: logprobs <- top_logprobs), so
        that a rejected value's 400 names the field the client sent."""
        from pagedkv.engine.sampling_params import SamplingParams

        kwargs: Dict[str, Any] = {"max_tokens": max_tokens}
        for name in _SAMPLING_FIELDS:
            value = getattr(req, name, None)
            if value is not None:
                kwargs[name] = value
        if isinstance(kwargs.get("stop"), str):
            kwargs["stop"] = [kwargs["stop"]]
        if logprobs is not None:
            kwargs["logprobs"] = logprobs
        if prompt_logprobs is not None:
            kwargs["prompt_logprobs"] = prompt_logprobs
        self.check_n(req.n)
        names = {name: name for name in kwargs}
        names.update(fields or {})
        try:
            return SamplingParams(**kwargs)
        except (ValueError, TypeError) as exc:
            raise bad_request(str(exc), param=field_named_in(str(exc), names)) from exc

    # ---------------------------------------------------------------- running requests

    async def start(self, request_id: str, ids: List[int], prompt: Optional[str], params: Any,
                    priority: int = 0, prompt_param: str = "prompt") -> Any:
        try:
            return await self.engine.add_request(request_id, prompt, params,
                                                 prompt_token_ids=ids, priority=priority)
        except ValueError as exc:
            # The engine's own checks are about the prompt (length, token ids) or parameters.
            names = {"prompt": prompt_param, "prompt_token_ids": prompt_param,
                     "max_tokens": "max_tokens", **{f: f for f in _SAMPLING_FIELDS}}
            raise bad_request(str(exc), param=field_named_in(str(exc), names)) from exc

    async def start_all(self, base_id: str, prompts: List[tuple], priority: int = 0,
                        prompt_param: str = "prompt") -> List[Any]:
        """Adds every (ids, text, params) prompt; on any rejection aborts those already added."""
        streams: List[Any] = []
        try:
            for i, (ids, text, params) in enumerate(prompts):
                rid = base_id if len(prompts) == 1 else f"{base_id}-{i}"
                streams.append(await self.start(rid, ids, text, params, priority, prompt_param))
        except BaseException:
            for s in streams:
                s.close()
            raise
        return streams

    async def deltas(self, streams: List[Any], n: int, timer: RequestTimer
                     ) -> AsyncIterator[Delta]:
        """New text / tokens of every choice, as they arrive, across all prompts' streams.

        Choice ``c`` of prompt ``i`` is response choice ``i * n + c``. A choice yields nothing
        until it has new text (the detokenizer may hold back partial characters), and exactly
        one delta carries its finish_reason: its last one.
        """
        sent_text: Dict[int, int] = {}
        sent_tokens: Dict[int, int] = {}
        done: set = set()
        active = list(range(len(streams)))
        while active:
            for i in list(active):
                out = await streams[i].__anext__()
                if out.finished:
                    active.remove(i)
                for c in out.outputs:
                    idx = i * n + c.index
                    if idx in done:
                        continue
                    st, sk = sent_text.get(idx, 0), sent_tokens.get(idx, 0)
                    finish = c.finish_reason or ("stop" if out.finished else None)
                    if len(c.text) <= st and finish is None:
                        continue
                    lps = getattr(c, "logprobs", None)
                    delta = Delta(i, idx, c.text[st:], list(c.token_ids[sk:]),
                                  list(lps[sk:]) if lps is not None else None, finish,
                                  getattr(c, "stop_reason", None), idx not in sent_text, out)
                    sent_text[idx], sent_tokens[idx] = len(c.text), len(c.token_ids)
                    if delta.token_ids:
                        timer.token()
                    if finish is not None:
                        done.add(idx)
                    yield delta

    async def finals(self, streams: List[Any], timer: RequestTimer) -> List[Any]:
        """The final RequestOutput of every stream (they all run concurrently in the engine)."""
        results = []
        for stream in streams:
            out = None
            async for out in stream:
                if any(c.token_ids for c in out.outputs):
                    timer.token()
            results.append(out)
        return results

    async def sse(self, request_id: str, bodies: AsyncIterator[Dict[str, Any]],
                  streams: List[Any], timer: RequestTimer, latest: List[Any],
                  reasons: List[Optional[str]], usage_chunk: Optional[Dict[str, Any]]
                  ) -> AsyncIterator[str]:
        """Server-sent events of one streamed request: each chunk body, then the usage chunk
        (when the client asked for it) and [DONE]. A client that goes away aborts the request
        (its streams close, the engine frees its blocks); an engine error after the headers are
        sent is reported in-band. ``latest`` holds the newest output of each prompt and
        ``reasons`` the finish reasons, both filled by ``bodies`` as it runs."""
        try:
            async for body in bodies:
                yield chunk(body)
            if usage_chunk is not None:
                yield chunk(dict(usage_chunk, choices=[], usage=self.usage(latest).model_dump()))
            yield DONE
        except asyncio.CancelledError:
            logger.info("client disconnected: %s aborted", request_id)
            raise
        except Exception as exc:  # noqa: BLE001 - headers are sent: report in-band
            logger.exception("stream %s failed", request_id)
            yield APIError(500, f"{type(exc).__name__}: {exc}").sse()
            yield DONE
        finally:
            for s in streams:
                s.close()
            timer.done(self.usage(latest).completion_tokens, reasons)

    def usage(self, outputs: Sequence[Any]) -> UsageInfo:
        prompt = sum(len(o.prompt_token_ids or ()) for o in outputs if o is not None)
        completion = sum(len(c.token_ids) for o in outputs if o is not None for c in o.outputs)
        return UsageInfo(prompt_tokens=prompt, completion_tokens=completion,
                         total_tokens=prompt + completion)

    def log_request(self, request_id: str, prompt_lens: Sequence[int], params: Any,
                    stream: bool) -> None:
        logger.info("request %s: prompt_tokens=%s n=%s max_tokens=%s temperature=%s stream=%s",
                    request_id, list(prompt_lens), getattr(params, "n", 1),
                    getattr(params, "max_tokens", None), getattr(params, "temperature", None),
                    stream)


@dataclass
class Delta:
    prompt_index: int
    index: int                       # choice index in the response
    text: str                        # new text since the previous delta of this choice
    token_ids: List[int]             # new tokens
    logprobs: Optional[List[Any]]    # their logprob tables
    finish_reason: Optional[str]
    stop_reason: Any
    first: bool                      # the first delta of this choice
    output: Any                      # the cumulative RequestOutput it came from


class RequestTimer:
    """Server-side latency of one request, for the metrics histograms and the log line."""

    def __init__(self, metrics: ServerMetrics, request_id: str) -> None:
        self.metrics = metrics
        self.request_id = request_id
        self.start = time.perf_counter()
        self.first: Optional[float] = None

    def token(self) -> None:
        if self.first is None:
            self.first = time.perf_counter()

    def done(self, num_tokens: int, finish_reasons: Sequence[Optional[str]]) -> None:
        end = time.perf_counter()
        ttft = (self.first or end) - self.start
        tpot = (end - (self.first or end)) / (num_tokens - 1) if num_tokens > 1 else None
        self.metrics.observe_request(ttft, tpot, end - self.start, finish_reasons)
        # Reasons with their counts, so that a request with many choices logs one short line.
        counts = Counter(str(r) for r in finish_reasons)
        logger.info("finished %s: completion_tokens=%d finish=%s ttft=%.3fs e2e=%.3fs",
                    self.request_id, num_tokens, ",".join(f"{r}x{k}" if k > 1 else r
                                                          for r, k in counts.items()),
                    ttft, end - self.start)


async def cancel_on_disconnect(raw: Request, work: Awaitable[T]) -> Optional[T]:
    """Runs ``work``; if the HTTP client goes away first, cancels it (aborting its requests)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(raw))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # let it abort its requests
    if task.cancelled():
        logger.info("client disconnected: request cancelled")
        return None
    return task.result()


async def _wait_disconnect(raw: Request) -> None:
    while True:
        message = await raw.receive()
        if message["type"] == "http.disconnect":
            return
