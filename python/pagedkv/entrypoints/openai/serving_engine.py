"""What the completion and chat handlers share: model names, tokenization, length checks,
SamplingParams from a request, logprob formatting, client-disconnect handling, request logs."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    List,
    Optional,
    Sequence,
    TypeVar,
)

from fastapi import Request

from pagedkv.engine.input_processor import RequestLimits, check_request_id
from pagedkv.entrypoints.openai.errors import APIError, bad_request, field_named_in
from pagedkv.entrypoints.openai.metrics import ServerMetrics
from pagedkv.entrypoints.openai.protocol import DONE, UsageInfo, chunk, random_id

logger = logging.getLogger("pagedkv.server")
T = TypeVar("T")

# Request fields passed to SamplingParams under the same name when the client set them.
_SAMPLING_FIELDS = ("n", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
                    "frequency_penalty", "repetition_penalty", "seed", "stop", "stop_token_ids",
                    "ignore_eos", "min_tokens", "skip_special_tokens",
                    "include_stop_str_in_output", "spaces_between_special_tokens",
                    "allowed_token_ids", "bad_words")

# The most logprobs a request may ask for per token when the engine does not say (vLLM's
# default max_logprobs); a served engine's own cap (--max-logprobs) is ServerState.max_logprobs.
MAX_LOGPROBS = 20
# The scheduler keeps a request's priority as a signed 32-bit integer.
_INT32 = (-(2**31), 2**31 - 1)


def is_unset(value: Any) -> bool:
    return value is None or value is False or value == [] or value == {} or value == ""


def text_format(value: Any) -> bool:
    return value is None or (isinstance(value, dict) and value.get("type") == "text")


def no_tool_choice(value: Any) -> bool:
    return value is None or value == "none"


# Request fields of OpenAI / vLLM that would change the output but that pagedkv does not
# implement: a request that sets one gets a 400 "<field> is not supported" instead of an answer
# that silently ignores it. Field -> "this value is harmless" (unset / the default behaviour).
# Fields of both endpoints; the chat endpoint adds its own (serving_chat.py).
UNSUPPORTED: Dict[str, Callable[[Any], bool]] = {
    "response_format": text_format,
    "use_beam_search": is_unset,
    "logits_processors": is_unset,
    "prompt_embeds": is_unset,
    "structured_outputs": is_unset,
    "guided_json": is_unset,
    "guided_regex": is_unset,
    "guided_choice": is_unset,
    "guided_grammar": is_unset,
    "structural_tag": is_unset,
    # vLLM isolates the prefix cache of requests with a salt; ignoring it would share cached
    # prompts across the tenants it is meant to separate.
    "cache_salt": is_unset,
}


@dataclass
class ServerState:
    """Everything a handler needs, built once per app."""

    engine: Any                      # AsyncLLMEngine
    served_model_names: List[str]    # the first one is reported in responses
    model_aliases: List[str]         # other names accepted in requests (model path, ...)
    max_model_len: int
    chat_template: Optional[str]
    metrics: ServerMetrics
    limits: RequestLimits = field(default_factory=RequestLimits)  # --max-* (limits.py)
    response_role: str = "assistant"  # --response-role
    max_logprobs: int = MAX_LOGPROBS  # the engine's cap (--max-logprobs; -1 resolved)
    trust_request_chat_template: bool = False  # --trust-request-chat-template
    started: float = field(default_factory=time.time)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]


class OpenAIServing:
    # Tokenizing runs here, off the event loop (as vLLM does): a long prompt takes seconds and
    # the loop must keep serving /health, streams and other requests meanwhile. The fast
    # tokenizer releases the GIL while it works. One thread for requests that generate, and
    # one for /tokenize, which may count texts longer than the context.
    _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagedkv-tokenize")
    _count_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagedkv-count")

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.engine = state.engine
        self.tokenizer = state.engine.tokenizer
        # No token of the vocabulary spans more characters than this, so a text longer than
        # max_model_len times it cannot fit the context: such a prompt gets its 400 before it
        # is tokenized (a 30 MB prompt would keep the tokenizer busy for ~20 s).
        self.token_chars = _max_token_chars(self.tokenizer)
        self.max_chars = state.max_model_len * self.token_chars

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

    def check_length(self, text_len: int, param: str) -> None:
        """400 for a text too long (in characters) to fit max_model_len in any tokenization."""
        if text_len > self.max_chars:
            raise bad_request(
                f"{param} is {text_len} characters long, more than can fit this model's "
                f"maximum context length of {self.state.max_model_len} tokens (at most "
                f"{self.max_chars} characters). Please reduce the length of the {param}.",
                param=param)

    async def encode_async(self, text: str, add_special_tokens: bool = True,
                           param: Optional[str] = "prompt",
                           keep_last: Optional[int] = None) -> List[int]:
        """``encode`` in the tokenizer thread. With ``param``, a text that cannot fit the
        context is first rejected by its length (400 naming ``param``); /tokenize passes None
        (it may count any text) and runs in a thread of its own. ``keep_last``: vLLM's
        truncate_prompt_tokens, the last tokens only (of a text cut first to the characters
        they can span, with a margin, so that a huge text is not tokenized whole)."""
        if keep_last is not None:
            text = text[-(keep_last + 16) * self.token_chars:]
        elif param is not None:
            self.check_length(len(text), param)
        executor = self._executor if param is not None else self._count_executor
        ids = await asyncio.get_running_loop().run_in_executor(
            executor, self.encode, text, add_special_tokens)
        return ids[-keep_last:] if keep_last is not None else ids

    def truncation(self, req: Any) -> Optional[int]:
        """vLLM's truncate_prompt_tokens: keep the prompt's last k tokens (-1: max_model_len);
        None: no truncation."""
        k = getattr(req, "truncate_prompt_tokens", None)
        limit = self.state.max_model_len
        if k is None:
            return None
        if k == -1:
            return limit
        if k < 1:
            raise bad_request(f"truncate_prompt_tokens must be >= 1 or -1, got {k}",
                              param="truncate_prompt_tokens")
        if k > limit:  # vLLM's words
            raise bad_request(f"truncate_prompt_tokens value ({k}) is greater than "
                              f"max_model_len ({limit}). Please, select a smaller truncation "
                              "size.", param="truncate_prompt_tokens")
        return k

    async def in_tokenizer_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the requests' tokenizer thread (chat templates render there)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def in_count_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in /tokenize's thread: the unbounded tokenizer work of /tokenize and
        /detokenize stays off the event loop and out of the requests' tokenizer thread."""
        return await asyncio.get_running_loop().run_in_executor(self._count_executor, fn, *args)

    def check_supported(self, req: Any, extra: Optional[Dict[str, Callable[[Any], bool]]] = None
                        ) -> None:
        """400 for a field pagedkv does not implement (UNSUPPORTED), set to a value that would
        change the output, rather than an answer that ignores it."""
        for name, harmless in {**UNSUPPORTED, **(extra or {})}.items():
            value = getattr(req, name, None)
            if not harmless(value):
                shown = repr(value)
                shown = shown if len(shown) <= 80 else shown[:77] + "..."  # tools can be long
                raise bad_request(f"{name} is not supported (got {shown})", param=name)

    def check_request(self, req: Any, handled: Sequence[str] = ()) -> None:
        """What both endpoints check before any work, as vLLM does. ``handled``: the extra
        (undeclared) fields the endpoint checks itself."""
        self.check_supported(req)
        # Fields pagedkv does not know are ignored; vLLM logs them, so a client can see why a
        # setting had no effect (e.g. OpenAI's `verbosity`, which vLLM does not implement).
        ignored = sorted(set(req.model_extra or ()) - set(UNSUPPORTED) - set(handled))
        if ignored:
            logger.warning("The following fields were present in the request but ignored: %s",
                           ", ".join(ignored))
        if req.best_of is not None and req.best_of != req.n:
            # vLLM V1 has no best_of either; best_of == n is plain sampling.
            raise bad_request("best_of is not supported (use n)", param="best_of")
        # A present, non-empty stream_options without stream (vLLM lets {} through).
        so = req.stream_options
        if so is not None and so.model_fields_set and not req.stream:
            raise bad_request("Stream options can only be defined when `stream=True`.",
                              param="stream_options")
        if req.prompt_logprobs is not None:
            self.check_logprobs(req.prompt_logprobs, "prompt_logprobs")
            if req.stream and req.prompt_logprobs > 0:
                raise bad_request("`prompt_logprobs` are not available when `stream=True`.",
                                  param="prompt_logprobs")
        if not _INT32[0] <= req.priority <= _INT32[1]:
            raise bad_request(f"priority must be a 32-bit integer in [{_INT32[0]}, "
                              f"{_INT32[1]}], got {req.priority}", param="priority")

    def check_logprobs(self, value: Optional[int], param: str) -> None:
        """A logprobs count in [0, the engine's --max-logprobs] (400 naming ``param``)."""
        cap = self.state.max_logprobs
        if value is not None and not 0 <= value <= cap:
            raise bad_request(f"{param} must be in [0, {cap}], got {value} (the server's "
                              "--max-logprobs sets the cap)", param=param)

    def logit_bias(self, bias: Optional[Dict[str, float]]) -> Optional[Dict[int, float]]:
        """The request's logit_bias as SamplingParams takes it: integer token ids (JSON keys
        are strings), each in the model's vocabulary, values clamped to [-100, 100] as OpenAI
        and vLLM do."""
        if not bias:
            return None
        ids: Dict[int, float] = {}
        for key, value in bias.items():
            try:
                ids[int(key)] = min(100.0, max(-100.0, float(value)))
            except ValueError:
                raise bad_request(f"logit_bias keys must be token ids (integers), got {key!r}",
                                  param="logit_bias") from None
        vocab = int(self.engine.model_config.vocab_size)
        outside = sorted(t for t in ids if not 0 <= t < vocab)
        if outside:
            raise bad_request(f"token_id(s) {outside[:10]} in logit_bias contain out-of-vocab "
                              f"token ids. Vocabulary size: {vocab}", param="logit_bias")
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids -> text with special tokens spelled out, as vLLM's /detokenize, echoed
        token-id prompts and logprob tokens show them (HF's decode default): the text then
        matches the ids, and echo's logprobs text_offset the echoed text."""
        try:
            return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))
        except TypeError:  # a tokenizer without the keyword
            return str(self.tokenizer.decode(list(ids)))

    def decode_token(self, token_id: int) -> str:
        return self.decode([token_id])

    def check_ids(self, ids: Sequence[int], param: str) -> None:
        if not ids:
            raise bad_request("the prompt is empty", param=param)
        vocab = getattr(self.tokenizer, "vocab_size", None)
        bad = [t for t in ids if t < 0 or (vocab is not None and t >= vocab)]
        if bad:
            raise bad_request(f"token id {bad[0]} is out of range [0, {vocab})", param=param)

    def check_n(self, n: int) -> None:
        """`n` is an int (pydantic checked that) of at least 1; the InputProcessor applies the
        server's upper limit."""
        if n < 1:
            raise bad_request(f"n must be at least 1, got {n}", param="n")

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
        bias = self.logit_bias(getattr(req, "logit_bias", None))
        if bias:
            kwargs["logit_bias"] = bias
        self.check_n(req.n)
        names = {name: name for name in kwargs}
        names.update(fields or {})
        try:
            return SamplingParams(**kwargs)
        except (ValueError, TypeError) as exc:
            raise bad_request(str(exc), param=field_named_in(str(exc), names)) from exc

    # ---------------------------------------------------------------- running requests

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
                check_request_id(given, "X-Request-Id" if header else "request_id")
            except ValueError as exc:
                raise bad_request(str(exc), param=None if header else "request_id") from None
        rid = f"{prefix}-{given}" if given else random_id(prefix)
        raw.state.request_id = rid  # for --enable-request-id-headers (api_server.py)
        return rid, f"{rid}-{uuid.uuid4().hex[:8]}" if given else rid

    async def start(self, request_id: str, ids: List[int], prompt: Optional[str], params: Any,
                    priority: int = 0, prompt_param: str = "prompt") -> Any:
        """Checks the request (the engine's InputProcessor, with this server's limits) in the
        tokenizer thread, where its bad words are tokenized too, then hands it to the engine
        loop, which only adds it. A ValueError of either (a TypeError of the checks) is the
        request's fault, a 400; anything else the engine raises is the server's failure: the
        app's handler answers 500 in JSON (errors.py)."""
        processor = getattr(self.engine, "input_processor", None)
        if processor is not None:
            try:
                prompt = await self.in_tokenizer_thread(functools.partial(
                    processor.process, request_id, prompt, params, prompt_token_ids=ids,
                    priority=priority, limits=self.state.limits))
            except (ValueError, TypeError) as exc:
                raise self._as_400(exc, prompt_param) from exc
            ids = None  # type: ignore[assignment]
        try:
            return await self.engine.add_request(request_id, prompt, params,
                                                 prompt_token_ids=ids, priority=priority)
        except ValueError as exc:
            raise self._as_400(exc, prompt_param) from exc

    @staticmethod
    def _as_400(exc: Exception, prompt_param: str) -> APIError:
        """The InputProcessor's / engine's error as a 400 naming the request field its
        message starts with."""
        names = {"prompt": prompt_param, "prompt_token_ids": prompt_param,
                 "max_tokens": "max_tokens", "priority": "priority",
                 "logit_bias": "logit_bias", **{f: f for f in _SAMPLING_FIELDS}}
        param = field_named_in(str(exc), names)
        if param is None and "priority" in str(exc).lower():
            param = "priority"  # vLLM: "Got priority 5 but Priority scheduling is not ..."
        if param is None and "logprobs" in str(exc):
            param = "logprobs"  # "Requested sample logprobs of 25, which is greater ..."
        return bad_request(str(exc), param=param)

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
        async for i, out in _merged(streams):
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
                    timer.token(idx)
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
            usage = self.usage(latest)
            timer.done(usage.completion_tokens, reasons, usage.prompt_tokens, latest)

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
        self.last: Optional[float] = None

    def token(self, choice: int = 0) -> None:
        """New tokens of response choice ``choice`` arrived; the intervals between the first
        choice's arrivals are the inter-token latencies."""
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        if choice != 0:
            return
        if self.last is not None:
            self.metrics.observe_token_interval(now - self.last)
        self.last = now

    def done(self, num_tokens: int, finish_reasons: Sequence[Optional[str]],
             prompt_tokens: int = 0, outputs: Sequence[Any] = ()) -> None:
        """``outputs``: the request's latest RequestOutputs (their engine milestones)."""
        end = time.perf_counter()
        ttft = (self.first or end) - self.start
        tpot = (end - (self.first or end)) / (num_tokens - 1) if num_tokens > 1 else None
        first = next((o for o in outputs if o is not None), None)
        self.metrics.observe_request(ttft, tpot, end - self.start, finish_reasons,
                                     prompt_tokens, num_tokens,
                                     getattr(first, "metrics", None))
        # Reasons with their counts, so that a request with many choices logs one short line.
        counts = Counter(str(r) for r in finish_reasons)
        logger.info("finished %s: completion_tokens=%d finish=%s ttft=%.3fs e2e=%.3fs",
                    self.request_id, num_tokens, ",".join(f"{r}x{k}" if k > 1 else r
                                                          for r, k in counts.items()),
                    ttft, end - self.start)


async def _merged(streams: List[Any]) -> AsyncIterator[tuple[int, Any]]:
    """(stream index, output) as each of ``streams`` produces them. Several streams (a batch of
    prompts) are read concurrently: reading them in turn would hold a running prompt's tokens
    back, unstreamed, while the next one waits for the engine to schedule it."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: Any) -> None:
        try:
            async for out in stream:
                queue.put_nowait((i, out, None))
        except Exception as exc:  # noqa: BLE001 - handed to the reader, which raises it
            queue.put_nowait((i, None, exc))
            return
        queue.put_nowait((i, None, None))  # this stream is done

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        active = len(streams)
        while active:
            i, out, exc = await queue.get()
            if exc is not None:
                raise exc
            if out is None:
                active -= 1
                continue
            yield i, out
    finally:
        for t in tasks:
            t.cancel()


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


def _max_token_chars(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` can stand for: its longest vocabulary
    entry. Byte-level BPE writes one character per byte and a text character is at least one
    byte; SentencePiece writes one per character ("\u2581" for a space). 64 when the
    tokenizer does not show its vocabulary."""
    hf = getattr(tokenizer, "hf", tokenizer)
    try:
        vocab = hf.get_vocab()
    except Exception:  # noqa: BLE001 - any tokenizer without a readable vocabulary
        return 64
    return max((len(t) for t in vocab), default=64) or 64
