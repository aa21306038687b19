"""AsyncLLMEngine: one background thread steps an LLMEngine; asyncio callers stream its outputs.

The LLMEngine is not thread-safe, so *every* call into it (add, abort, step, stats) happens on
the engine thread; callers talk to that thread through a command queue and get their outputs
back through a per-request asyncio queue fed with ``loop.call_soon_threadsafe``. torch releases
the GIL during the forward pass, so the event loop keeps serving HTTP while a step runs.

Lifetimes: a request's stream lives from ``generate()`` until its final output. A caller that
stops iterating early (client disconnect, task cancellation, ``aclose()``) aborts the request,
which frees its KV blocks. If a step raises, LLMEngine aborts the requests that step was
running and stays usable: their callers get :class:`StepFailedError` (the server's 500), the
other requests go on; such a failure is the requests' and never kills the engine, however often
it happens. The engine is marked dead only for faults that are not a request's: a device error
(CUDA), ``_MAX_FAILED_STEPS`` failed steps in a row that aborted no request (the loop itself is
broken), or a BaseException such as SystemExit. Then every pending request gets
:class:`EngineDeadError` (instead of hanging), new requests are refused, and the server's
``/health`` answers 503 with the reason.

Requests are checked and tokenized (the engine's InputProcessor) in a worker thread of their
own before they reach the engine thread: a huge prompt or bad_words list costs its own caller
time, never a step of the others.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import dataclasses
import functools
import inspect
import logging
import queue
import threading
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Sequence, Tuple, Union

from pagedkv.engine.input_processor import EngineRequest
from pagedkv.engine.request_failures import is_device_error

logger = logging.getLogger("pagedkv.engine")

_IDLE_POLL_S = 0.5  # how often an idle engine thread refreshes its stats snapshot
_STALL_WAIT_S = 0.001  # pause after a step that produced no output


# The engine knobs a server passes through (vLLM's names); LLMEngine may accept more.
def _engine_arg_names() -> set:
    """What LLMEngine takes: its named parameters, and, since it forwards **kwargs to its
    config, every EngineConfig field (derived, so a new knob reaches the engine from the CLI
    without a list to keep in step) but served_model_name: the server reports its names itself,
    and the CLI's is a list of them."""
    from pagedkv.engine.config import EngineConfig
    from pagedkv.engine.llm_engine import LLMEngine

    params = inspect.signature(LLMEngine.__init__).parameters
    names = {n for n, p in params.items() if p.kind is not p.VAR_KEYWORD} - {"self"}
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        names |= {f.name for f in dataclasses.fields(EngineConfig)} - {"served_model_name"}
    return names


class EngineDeadError(RuntimeError):
    """The engine loop has stopped after an error; no request can be served."""


class EngineShutDown(RuntimeError):
    """Why a shut-down engine serves no request (its dead_error)."""


class RequestAbortedError(RuntimeError):
    """abort() stopped this request before it had a result to return."""


class StepFailedError(RuntimeError):
    """The engine step running this request raised; the request was aborted (others go on)."""


_MAX_FAILED_STEPS = 3  # consecutive failed steps, none aborting a request, that kill the loop


class RequestStream:
    """Outputs of one request, handed from the engine thread to the caller's event loop.

    An async iterator of cumulative RequestOutputs that ends after the final one. ``close()``
    (called by :meth:`AsyncLLMEngine.generate` on exit, or by the caller) aborts the request
    in the engine unless it has already finished.
    """

    def __init__(
        self, engine: AsyncLLMEngine, request_id: str, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.request_id = request_id
        self.finished = False
        self._engine = engine
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()
        self._closed = False
        self.last: Any = None  # the newest snapshot put (engine thread only)
        # The engine took the request (engine thread only): before, its add command is still
        # queued, and a step that fails meanwhile cannot have run it.
        self.admitted = False

    def put(self, item: Any) -> None:  # engine thread
        # RuntimeError: the caller's loop is closed, nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Any:
        if self.finished:
            raise StopAsyncIteration
        items = [await self._queue.get()]
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        for item in items:
            if isinstance(item, BaseException):
                self.close()
                raise item
        # Outputs are cumulative, so a slow consumer only needs the newest one.
        out = items[-1]
        if out.finished:
            self.finished = True
            self.close()
        return out

    def close(self) -> None:
        """Stops listening; aborts the request (freeing its blocks) if it has not finished."""
        if self._closed:
            return
        self._closed = True
        self._engine._release(self.request_id, abort=not self.finished)


def _snapshot(out: Any, prev: Any = None) -> Any:
    """A copy of a RequestOutput that later engine steps cannot mutate under the reader.

    ``prev`` is the previous snapshot of the same request. Outputs are cumulative, so a sample
    whose token count, text and finish are those of its copy in ``prev`` has not changed: that
    copy is shared instead of copying the sample again. A step then costs copies of the samples
    that advanced only, not of all n (samples that finished early stop costing anything).
    Snapshots are read-only for their readers."""
    try:
        snap = copy.copy(out)
        before = prev.outputs if prev is not None else ()
        snap.outputs = [
            _copy_sample(c, before[i] if i < len(before) else None)
            for i, c in enumerate(out.outputs)
        ]
        return snap
    except (AttributeError, TypeError):  # frozen / slotted outputs are safe to share as is
        return out


def _copy_sample(c: Any, prev: Any) -> Any:
    if (
        prev is not None
        and prev.index == c.index
        and len(prev.token_ids) == len(c.token_ids)
        and prev.finish_reason == c.finish_reason
        and prev.text == c.text
    ):
        return prev
    c = copy.copy(c)
    c.token_ids = list(c.token_ids)
    if getattr(c, "logprobs", None) is not None:
        c.logprobs = list(c.logprobs)
    return c


class AsyncLLMEngine:
    """Asyncio front end of :class:`pagedkv.engine.llm_engine.LLMEngine`.

    ``AsyncLLMEngine(**kwargs)`` builds an LLMEngine with the same keyword arguments;
    ``AsyncLLMEngine(engine=existing)`` wraps one already built.
    """

    def __init__(self, engine: Any = None, **engine_kwargs: Any) -> None:
        if engine is None:  # (a PoolingEngine for pooling models: runner_choice.py)
            from pagedkv.engine.runner_choice import make_engine

            engine = make_engine(**engine_kwargs)
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: Dict[str, RequestStream] = {}
        self._lock = threading.Lock()  # guards _streams, _dead and command submission
        self._dead: Optional[BaseException] = None
        self._stopping = False
        self._stats: Dict[str, Any] = dict(engine.get_stats())
        # Called on the engine thread after each step with the tokens it processed (the
        # server's iteration_tokens_total histogram).
        self._step_observers: List[Callable[[int], None]] = []
        # Checks and tokenizes requests off the engine thread (the fast tokenizer releases the
        # GIL); two threads so that one huge request does not hold up every other one.
        self._inputs = concurrent.futures.ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="pagedkv-inputs"
        )
        self._thread = threading.Thread(target=self._run, name="pagedkv-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_engine_args(cls, args: Any = None, **overrides: Any) -> AsyncLLMEngine:
        """Build from an argparse Namespace / dict; keys LLMEngine does not take are dropped
        (a CLI namespace also holds host, port, ...)."""
        given = dict(vars(args) if args is not None and not isinstance(args, dict) else args or {})
        given.update(overrides)
        accepted = _engine_arg_names()
        return cls(**{k: v for k, v in given.items() if k in accepted})

    # ------------------------------------------------------------------ public API

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def model_config(self) -> Any:
        return self.engine.model_config

    @property
    def input_processor(self) -> Any:
        """The engine's InputProcessor (the server runs it in its own threads, with its
        limits); None for an engine without one."""
        return getattr(self.engine, "input_processor", None)

    @property
    def is_dead(self) -> bool:
        return self._dead is not None

    @property
    def dead_error(self) -> Optional[BaseException]:
        return self._dead

    @property
    def dead_reason(self) -> Optional[str]:
        """Why the engine died (what /health reports), or None while it runs."""
        if self._dead is None:
            return None
        if isinstance(self._dead, EngineShutDown):
            return str(self._dead)
        kind = " (device error)" if is_device_error(self._dead) else ""
        return f"engine loop died{kind}: {self._dead!r}"

    def check_health(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(self.dead_reason)

    def get_stats(self) -> Dict[str, Any]:
        """The engine's counters as of its last loop iteration (read without blocking)."""
        return dict(self._stats)

    def add_step_observer(self, observer: Callable[[int], None]) -> None:
        """``observer(num_tokens)`` after every engine step: the prompt and generated tokens
        the step added to the engine's counters (a prompt counts at the step completing it)."""
        self._step_observers.append(observer)

    def num_active_requests(self) -> int:
        with self._lock:
            return len(self._streams)

    async def add_request(
        self,
        request_id: str,
        prompt: Union[str, Sequence[int], Dict[str, Any], EngineRequest, None],
        sampling_params: Any,
        *,
        prompt_token_ids: Optional[Sequence[int]] = None,
        priority: int = 0,
        lora_request: Any = None,
    ) -> RequestStream:
        """Queues a request and waits until the engine accepted it.

        Raises ValueError (from LLMEngine.add_request: prompt too long, bad parameters) before
        anything is streamed, so a server can still answer 400. ``prompt`` may be text or a
        list of token ids, or an EngineRequest the caller already checked (the server does, in
        its own threads, with its limits).
        """
        if prompt is not None and not isinstance(prompt, (str, dict, EngineRequest)):
            prompt_token_ids = list(prompt)
            prompt = None
        self.check_health()
        processor = getattr(self.engine, "input_processor", None)
        if processor is not None and not isinstance(prompt, EngineRequest):
            prompt = await asyncio.get_running_loop().run_in_executor(
                self._inputs,
                functools.partial(
                    processor.process,
                    request_id,
                    prompt,
                    sampling_params,
                    prompt_token_ids=prompt_token_ids,
                    priority=priority,
                ),
            )
            prompt_token_ids = None
        stream = RequestStream(self, request_id, asyncio.get_running_loop())
        with self._lock:
            if request_id in self._streams:
                raise ValueError(f"request_id {request_id!r} is already in use")
            self._streams[request_id] = stream
        ids = list(prompt_token_ids) if prompt_token_ids is not None else None
        try:
            await asyncio.wrap_future(
                self._submit(
                    ("add", request_id, prompt, sampling_params, ids, priority, lora_request)
                )
            )
        except BaseException:
            stream.close()  # rejected, or the caller went away while it was queued
            raise
        return stream

    async def generate(
        self,
        prompt: Union[str, Sequence[int], None],
        sampling_params: Any,
        request_id: str,
        *,
        prompt_token_ids: Optional[Sequence[int]] = None,
        priority: int = 0,
        lora_request: Any = None,
    ) -> AsyncIterator[Any]:
        """Streams cumulative RequestOutputs of one request until its final one.

        Leaving the loop early (break, cancellation, client disconnect) aborts the request.
        """
        stream = await self.add_request(
            request_id,
            prompt,
            sampling_params,
            prompt_token_ids=prompt_token_ids,
            priority=priority,
            lora_request=lora_request,
        )
        try:
            async for out in stream:
                yield out
        finally:
            stream.close()

    def abort(self, request_id: Union[str, List[str]]) -> None:
        """Stops a request (or several) and frees its blocks; unknown ids are ignored."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        if self._dead is None:
            self._submit(("abort", ids))

    def _release(self, request_id: str, abort: bool) -> None:
        with self._lock:
            self._streams.pop(request_id, None)
        if abort:
            self.abort(request_id)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stops the engine thread. Requests still streaming or queued then get
        EngineDeadError ("the engine was shut down") instead of waiting forever, and new
        ones are refused with it."""
        self._stopping = True
        self._commands.put(("wake",))
        self._thread.join(timeout)
        self._inputs.shutdown(wait=False)
        self._die(EngineShutDown("the engine was shut down"))

    # ------------------------------------------------------------------ engine thread

    def _submit(self, command: tuple) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._dead is not None:
                fut.set_exception(EngineDeadError(self.dead_reason))
                return fut
            self._commands.put((*command, fut))
        return fut

    def _run(self) -> None:
        try:
            stalled, failures = False, 0
            while not self._stopping:
                # Idle: sleep until a command comes. Busy: take commands without waiting, but
                # after a step that produced nothing (waiting for blocks, or a prefill chunk)
                # wait a moment so that a stalled queue does not spin.
                busy = self.engine.has_unfinished_requests()
                self._drain_commands(_STALL_WAIT_S if stalled else 0.0 if busy else _IDLE_POLL_S)
                if self._stopping:
                    break
                try:
                    outputs = self.engine.step() if self.engine.has_unfinished_requests() else []
                except Exception as exc:
                    if is_device_error(exc):
                        raise
                    # A step that aborted requests failed because of them: they fail alone.
                    failures = 0 if self._fail_dropped(exc) else failures + 1
                    if failures >= _MAX_FAILED_STEPS:
                        raise
                    logger.exception("an engine step failed")
                    continue
                failures = 0
                self._dispatch(outputs, self.engine.take_request_errors())
                self._after_step(dict(self.engine.get_stats()))
                stalled = busy and not outputs
        except BaseException as exc:  # noqa: BLE001 - any failure kills the loop; report it
            logger.exception("engine loop died")
            self._die(exc)

    def _after_step(self, stats: Dict[str, Any]) -> None:
        """New stats snapshot; the step observers learn how many tokens the step added."""
        before, self._stats = self._stats, stats
        if not self._step_observers:
            return
        keys = ("prompt_tokens", "generation_tokens")
        added = sum(int(stats.get(k, 0)) - int(before.get(k, 0)) for k in keys)
        for observer in self._step_observers:
            try:
                observer(added)
            except Exception:  # noqa: BLE001 - a metrics hook must never stop the engine
                logger.exception("a step observer failed")

    def _drain_commands(self, timeout: float) -> None:
        """Runs queued commands, first waiting up to ``timeout`` s for one (0: no wait)."""
        try:
            cmd = (
                self._commands.get(timeout=timeout) if timeout > 0 else self._commands.get_nowait()
            )
        except queue.Empty:
            return
        while True:
            self._execute(cmd)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return

    def _execute(self, cmd: tuple) -> None:
        kind, fut = cmd[0], cmd[-1]
        if kind == "wake" or not fut.set_running_or_notify_cancel():
            return
        if kind == "add":
            _, request_id, prompt, params, ids, priority, lora, _ = cmd
            try:
                self.engine.add_request(
                    request_id,
                    prompt,
                    params,
                    prompt_token_ids=ids,
                    priority=priority,
                    lora_request=lora,
                )
            except Exception as exc:  # noqa: BLE001 - bad request: report to its caller only
                fut.set_exception(exc)
                return
            with self._lock:
                stream = self._streams.get(request_id)
            if stream is not None:
                stream.admitted = True
            fut.set_result(None)
        elif kind == "abort":
            held = [(rid, self.engine.requests.get(rid)) for rid in cmd[1]]
            try:
                self.engine.abort_request(cmd[1])
            except (KeyError, ValueError) as exc:  # already finished: nothing to free
                logger.debug("abort %s: %r", cmd[1], exc)
            self._end_aborted([(rid, req) for rid, req in held if req is not None])
            fut.set_result(None)

    def _end_aborted(self, aborted: List[Tuple[str, Any]]) -> None:
        """Streams still read of requests abort() stopped end, as vLLM's do: a generation
        request with its final output (finish_reason "abort"), a pooling request (no partial
        result) or one whose final output raises with RequestAbortedError; otherwise their
        readers would wait forever (and a raise here would end the engine thread)."""
        for rid, req in aborted:
            with self._lock:
                stream = self._streams.get(rid)
            if stream is None:
                continue  # its reader left first (close() sent this abort)
            final = None
            if hasattr(req, "to_output"):
                try:
                    final = _snapshot(req.to_output(), stream.last)
                except Exception as exc:  # noqa: BLE001 (its own output: not the engine's)
                    logger.warning("abort %s: its final output failed: %r", rid, exc)
            if final is not None:
                stream.last = final
                stream.put(final)
            else:
                stream.put(RequestAbortedError(f"request {rid!r} was aborted"))

    def _dispatch(self, outputs: List[Any], errors: Dict[str, Exception]) -> None:
        """The step's outputs to their streams; a request that failed alone (``errors``: its
        own work raised, the engine aborted it) gets StepFailedError instead."""
        for out in outputs:
            with self._lock:
                stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            exc = errors.get(out.request_id)
            if exc is not None:
                stream.put(StepFailedError(f"request {out.request_id!r} failed: {exc!r}"))
                continue
            stream.last = _snapshot(out, stream.last)
            stream.put(stream.last)

    def _fail_dropped(self, exc: Exception) -> int:
        """After a failed step: the streams of requests the engine no longer holds (it aborted
        the step's requests) get StepFailedError, unless their final output was already sent
        or their add is still queued. Returns how many requests failed."""
        with self._lock:
            dropped = [
                s
                for rid, s in self._streams.items()
                if s.admitted
                and rid not in self.engine.requests
                and not (s.last is not None and s.last.finished)
            ]
        for stream in dropped:
            stream.put(
                StepFailedError(
                    f"request {stream.request_id!r} failed: the engine step "
                    f"running it raised {exc!r}"
                )
            )
        return len(dropped)

    def _die(self, exc: BaseException) -> None:
        with self._lock:
            if self._dead is not None:  # (shutdown after a death: the first cause stays)
                return
            self._dead = exc
            streams = list(self._streams.values())
        error = EngineDeadError(self.dead_reason)
        for stream in streams:
            stream.put(error)
        while True:  # commands queued before death: their callers must not wait forever
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                break
            fut = cmd[-1]
            if isinstance(fut, concurrent.futures.Future) and fut.set_running_or_notify_cancel():
                fut.set_exception(error)
