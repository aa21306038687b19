"""Graceful drain on SIGTERM: what a rolling update or a node drain needs from the server.

On SIGTERM (`kubectl delete pod`, `docker stop`) the server
1. stops taking work: every new request gets 503 with a ``Retry-After`` header, /health and
   /ping included (so load balancers and readiness probes take the pod out), /metrics excepted
   (scrapers see the drain);
2. lets the requests in flight finish, for up to ``--shutdown-timeout`` seconds;
3. ends what is still running at the deadline: an open stream gets an error event and
   ``data: [DONE]``, a request whose answer has not started gets a 503; their handlers are
   cancelled, which aborts their engine requests and frees their KV blocks;
4. then lets uvicorn shut down, and the process exits with code 0.

A second SIGTERM skips the rest of the wait (step 3 at once). Ctrl-C (SIGINT) keeps uvicorn's
own behaviour. The drain is one ASGI middleware (it sees every request and its ``send``) and a
uvicorn.Server whose signal handler starts the drain instead of exiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Dict, Optional

import uvicorn
from fastapi.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

from pagedkv.entrypoints.openai.errors import APIError
from pagedkv.entrypoints.openai.protocol import DONE

logger = logging.getLogger("pagedkv.server")

# Paths that keep answering while draining: scrapers should see the drain happen.
_OPEN_WHILE_DRAINING = ("/metrics",)
# How long clients are told to wait before retrying elsewhere (seconds).
RETRY_AFTER_S = 5


@dataclass
class _InFlight:
    """One request the app is handling, and what of its response has been sent."""

    scope: Scope
    send: Send
    task: Optional[asyncio.Task[None]] = None  # the app's handler
    started: bool = False  # http.response.start sent
    streaming: bool = False  # a text/event-stream response
    cut: bool = False  # ended by the drain: it owns `send` from then on
    closed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Drain:
    """The drain's state, shared by the middleware and the server."""

    timeout_s: float
    draining: bool = False
    in_flight: Dict[int, _InFlight] = field(default_factory=dict)
    cut_at_deadline: int = 0
    _hurry: Optional[asyncio.Event] = None

    async def run(self, engine: Any) -> None:
        """Steps 1-3 of the module docstring; returns when nothing is in flight."""
        self.draining = True
        self._hurry = self._hurry or asyncio.Event()
        logger.info(
            "SIGTERM: draining; new requests get 503, the %d in flight get up to %g s",
            len(self.in_flight),
            self.timeout_s,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        while self.in_flight and loop.time() < deadline and not self._hurry.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._hurry.wait(), timeout=0.05)
        left = list(self.in_flight.values())
        self.cut_at_deadline = len(left)
        await asyncio.gather(*(self._cut(r) for r in left))
        stats = await _engine_idle(engine, loop.time() + 10.0)
        logger.info(
            "drained (%d requests cut at the deadline); engine: %d running, %d waiting, "
            "KV cache usage %.3f",
            self.cut_at_deadline,
            stats.get("num_requests_running", 0),
            stats.get("num_requests_waiting", 0),
            stats.get("kv_cache_usage_perc", 0.0),
        )

    def hurry(self) -> None:
        """A second SIGTERM: cut what is in flight now."""
        if self._hurry is not None:
            self._hurry.set()

    @staticmethod
    async def _cut(r: _InFlight) -> None:
        """Cancels the handler (which aborts its engine requests); the middleware then closes
        the response (it must: once the app returns, uvicorn drops an unfinished response)."""
        r.cut = True
        if r.task is not None:
            r.task.cancel()
        await r.closed.wait()


async def _engine_idle(engine: Any, until: float) -> Dict[str, Any]:
    """Aborted requests free their blocks on the engine's thread: waits until it reports no
    request and no block in use (or ``until``), and returns its last stats."""
    loop = asyncio.get_running_loop()
    while True:
        stats: Dict[str, Any] = dict(engine.get_stats())
        busy = (
            stats.get("num_requests_running")
            or stats.get("num_requests_waiting")
            or stats.get("kv_cache_usage_perc")
        )
        if not busy or loop.time() >= until:
            return stats
        await asyncio.sleep(0.05)


def _shutting_down(message: str) -> APIError:
    return APIError(503, message, code="server_shutting_down")


def _refusal(error: APIError) -> JSONResponse:
    return JSONResponse(
        error.body(), status_code=error.status, headers={"Retry-After": str(RETRY_AFTER_S)}
    )


async def _disconnected() -> Message:
    return {"type": "http.disconnect"}


class DrainMiddleware:
    """Plain ASGI (streams pass through unbuffered): refuses new requests while draining and
    runs each request's handler as a task the drain can cancel."""

    def __init__(self, app: Any, drain: Drain) -> None:
        self.app, self.drain = app, drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.drain.draining and scope["path"] not in _OPEN_WHILE_DRAINING:
            refusal = _shutting_down("the server is shutting down; retry on another replica")
            await _refusal(refusal)(scope, receive, send)
            return
        r = _InFlight(scope, send)

        async def tracked_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                r.started = True
                ctype = dict(message.get("headers") or []).get(b"content-type", b"")
                r.streaming = ctype.startswith(b"text/event-stream")
            await send(message)

        r.task = asyncio.ensure_future(self.app(scope, receive, tracked_send))
        self.drain.in_flight[id(r)] = r
        try:
            await r.task  # cancelling this request's own task (uvicorn) cancels r.task too
        except asyncio.CancelledError:
            if not r.cut:
                raise
            await _close(r)
        finally:
            self.drain.in_flight.pop(id(r), None)
            r.closed.set()


async def _close(r: _InFlight) -> None:
    """The end of a response cut by the drain: an error event and [DONE] for a stream, a 503
    for an answer not yet started (a started plain answer is one message, already complete)."""
    error = _shutting_down("the server is shutting down: the request was cut at --shutdown-timeout")
    try:
        if r.streaming:
            body = (error.sse() + DONE).encode()
            await r.send({"type": "http.response.body", "body": body, "more_body": False})
        elif not r.started:
            await _refusal(error)(r.scope, _disconnected, r.send)
    except Exception:  # noqa: BLE001 - the client may be gone already
        logger.debug("could not close a response cut by the drain", exc_info=True)


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose SIGTERM starts the drain; uvicorn's own shutdown follows it."""

    def __init__(self, config: uvicorn.Config, drain: Drain, engine: Any) -> None:
        super().__init__(config)
        self.drain, self.engine = drain, engine
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._drain_task: Optional[asyncio.Task[None]] = None

    async def startup(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)

    def handle_exit(self, sig: int, frame: Optional[FrameType]) -> None:
        if sig != signal.SIGTERM or self._loop is None:
            super().handle_exit(sig, frame)
            return
        # Not recorded as a captured signal: uvicorn re-raises those after its shutdown, and
        # SIGTERM's default action would turn the clean drain into exit status -15.
        first = self._drain_task is None
        self._loop.call_soon_threadsafe(self._start_drain if first else self.drain.hurry)

    def _start_drain(self) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        try:
            await self.drain.run(self.engine)
        except Exception:  # noqa: BLE001 - a failed drain must still stop the server
            logger.exception("the drain failed; shutting down")
        self.should_exit = True
