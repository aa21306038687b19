"""Reading a request's engine streams: new text per choice as it arrives, final outputs,
server-sent events, usage, and cancelling the work when the HTTP client goes away."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Dict, List, Optional, Sequence, TypeVar

from fastapi import Request

from pagedkv.entrypoints.openai.errors import APIError
from pagedkv.entrypoints.openai.protocol import DONE, UsageInfo, chunk
from pagedkv.entrypoints.openai.request_timer import RequestTimer

logger = logging.getLogger("pagedkv.server")
T = TypeVar("T")


class ResponseStreams:
    async def deltas(self, streams: List[Any], n: int, timer: RequestTimer) -> AsyncIterator[Delta]:
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
                delta = Delta(
                    i,
                    idx,
                    c.text[st:],
                    list(c.token_ids[sk:]),
                    list(lps[sk:]) if lps is not None else None,
                    finish,
                    getattr(c, "stop_reason", None),
                    idx not in sent_text,
                    out,
                )
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

    async def sse(
        self,
        request_id: str,
        bodies: AsyncIterator[Dict[str, Any]],
        streams: List[Any],
        timer: RequestTimer,
        latest: List[Any],
        reasons: List[Optional[str]],
        usage_chunk: Optional[Dict[str, Any]],
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
        return UsageInfo(
            prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
        )


@dataclass
class Delta:
    prompt_index: int
    index: int  # choice index in the response
    text: str  # new text since the previous delta of this choice
    token_ids: List[int]  # new tokens
    logprobs: Optional[List[Any]]  # their logprob tables
    finish_reason: Optional[str]
    stop_reason: Any
    first: bool  # the first delta of this choice
    output: Any  # the cumulative RequestOutput it came from


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
