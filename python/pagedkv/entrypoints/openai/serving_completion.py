"""POST /v1/completions: text or token-id prompts (one or a batch), streamed or not."""

from __future__ import annotations

from typing import Any, AsyncIterator, Dict, List, Optional, Tuple

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from pagedkv.entrypoints.openai import logprobs as lp
from pagedkv.entrypoints.openai.errors import bad_request
from pagedkv.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    dump,
)
from pagedkv.entrypoints.openai.request_timer import RequestTimer
from pagedkv.entrypoints.openai.serving_beam_search import beam_jobs, start_beam_searches
from pagedkv.entrypoints.openai.serving_engine import OpenAIServing
from pagedkv.entrypoints.openai.streaming import cancel_on_disconnect

Prompt = Tuple[List[int], Optional[str]]  # token ids, text (None when given as ids)


class OpenAIServingCompletion(OpenAIServing):
    async def create(self, req: CompletionRequest, raw: Request) -> Response:
        self.check_model(req.model)
        self.check_n(req.n)
        self.check_request(req)
        if req.suffix:
            raise bad_request("suffix is not supported", param="suffix")
        self.check_logprobs(req.logprobs, "logprobs")
        prompts = await self._prompts(req.prompt, req.add_special_tokens, self.truncation(req))
        # prompt_logprobs when given, else (vLLM's rule) echo's come from the logprobs field.
        prompt_lp, fields = req.prompt_logprobs, {}
        if prompt_lp is None and req.echo and req.logprobs is not None:
            prompt_lp, fields = req.logprobs, {"prompt_logprobs": "logprobs"}
        # echo with max_tokens 0 (OpenAI's and vLLM's way to score a text): the prompt and its
        # logprobs come back alone. The engine still runs one step (it generates at least one
        # token, which the answer leaves out; usage counts it, as vLLM's does).
        max_tokens = 1 if _echo_only(req) else req.max_tokens
        beams = beam_jobs(self, req, prompts, max_tokens)
        jobs = beams or [
            (
                ids,
                text,
                self.sampling_params(
                    req, self.max_tokens_for(len(ids), max_tokens), req.logprobs, prompt_lp, fields
                ),
            )
            for ids, text in prompts
        ]
        request_id, engine_id = self.request_ids(raw, req, "cmpl")
        self.log_request(request_id, [len(ids) for ids, _ in prompts], jobs[0][2], bool(req.stream))
        timer = RequestTimer(self.state.metrics, request_id)
        if beams is not None:
            streams: List[Any] = start_beam_searches(self, engine_id, beams, req)
        else:
            streams = await self.start_all(engine_id, jobs, req.priority, model=req.model)
        if req.stream:
            return StreamingResponse(
                self._stream(req, request_id, prompts, streams, timer),
                media_type="text/event-stream",
            )
        result = await cancel_on_disconnect(
            raw, self._full(req, request_id, prompts, streams, timer)
        )
        if result is None:
            return Response(status_code=499)
        return JSONResponse(dump(result))

    async def _prompts(
        self, prompt: Any, add_special_tokens: bool, keep_last: Optional[int] = None
    ) -> List[Prompt]:
        """(token ids, text) of each prompt; ``keep_last``: truncate_prompt_tokens (a truncated
        prompt's text, for echo, is that of the tokens kept)."""
        if isinstance(prompt, str):
            items: List[Any] = [prompt]
        elif not prompt:
            raise bad_request("prompt must not be empty", param="prompt")
        elif all(isinstance(p, int) for p in prompt):
            items = [list(prompt)]
        else:
            items = list(prompt)
        result: List[Prompt] = []
        for p in items:
            if isinstance(p, str):
                ids = await self.encode_async(p, add_special_tokens, keep_last=keep_last)
                text = p if keep_last is None else None
            else:
                ids, text = list(p)[-keep_last:] if keep_last else list(p), None
            self.check_ids(ids, "prompt")
            result.append((ids, text))
        return result

    def _prompt_text(self, prompt: Prompt) -> str:
        ids, text = prompt
        return text if text is not None else self.decode(ids)

    def _echo_logprobs(self, req: CompletionRequest, out: Any) -> List[lp.Entry]:
        table = getattr(out, "prompt_logprobs", None) or [None] * len(out.prompt_token_ids)
        k = req.logprobs or 0
        if req.prompt_logprobs is not None and req.prompt_logprobs > k:
            # The engine computed prompt_logprobs alternatives; echo shows logprobs of them.
            table = [
                None
                if pos is None
                else {
                    t: v for t, v in pos.items() if t == tid or (getattr(v, "rank", None) or 0) <= k
                }
                for tid, pos in zip(out.prompt_token_ids, table)
            ]
        return lp.entries(
            out.prompt_token_ids,
            table,
            self.decode_token,
            as_ids=bool(req.return_tokens_as_token_ids),
        )

    async def _full(
        self,
        req: CompletionRequest,
        request_id: str,
        prompts: List[Prompt],
        streams: List[Any],
        timer: RequestTimer,
    ) -> CompletionResponse:
        try:
            finals = await self.finals(streams, timer)
        finally:
            for s in streams:
                s.close()
        choices = []
        for i, out in enumerate(finals):
            prefix = self._prompt_text(prompts[i]) if req.echo else ""
            prompt_logprobs = lp.prompt_logprobs(
                getattr(out, "prompt_logprobs", None), self.decode_token
            )
            for c in out.outputs:
                generated, tokens = ("", []) if _echo_only(req) else (c.text, c.token_ids)
                logprobs = None
                if req.logprobs is not None:
                    items = self._echo_logprobs(req, out) if req.echo else []
                    items += lp.entries(
                        tokens,
                        c.logprobs or [],
                        self.decode_token,
                        as_ids=bool(req.return_tokens_as_token_ids),
                    )
                    logprobs = lp.completion_logprobs(items, 0)
                choices.append(
                    CompletionChoice(
                        index=i * req.n + c.index,
                        text=prefix + generated,
                        logprobs=logprobs,
                        finish_reason=c.finish_reason,
                        stop_reason=getattr(c, "stop_reason", None),
                        prompt_logprobs=prompt_logprobs,
                        prompt_token_ids=list(prompts[i][0]) if req.return_token_ids else None,
                        token_ids=list(tokens) if req.return_token_ids else None,
                    )
                )
        choices.sort(key=lambda ch: ch.index)
        usage = self.usage(finals)
        timer.done(
            usage.completion_tokens, [c.finish_reason for c in choices], usage.prompt_tokens, finals
        )
        return CompletionResponse(
            id=request_id, model=self.response_model(req.model), choices=choices, usage=usage
        )

    def _stream(
        self,
        req: CompletionRequest,
        request_id: str,
        prompts: List[Prompt],
        streams: List[Any],
        timer: RequestTimer,
    ) -> AsyncIterator[str]:
        base, include_usage, continuous = self.stream_head(req, request_id, "text_completion")
        reasons: List[Optional[str]] = [None] * (len(prompts) * req.n)  # by choice index
        latest: List[Any] = [None] * len(streams)
        bodies = self._chunks(req, base, prompts, streams, timer, latest, reasons, continuous)
        return self.sse(
            request_id, bodies, streams, timer, latest, reasons, base if include_usage else None
        )

    async def _chunks(
        self,
        req: CompletionRequest,
        base: Dict[str, Any],
        prompts: List[Prompt],
        streams: List[Any],
        timer: RequestTimer,
        latest: List[Any],
        reasons: List[Optional[str]],
        continuous: bool,
    ) -> AsyncIterator[Dict[str, Any]]:
        offsets: Dict[int, int] = {}  # text offset of each choice, for logprobs.text_offset
        async for d in self.deltas(streams, req.n, timer):
            latest[d.prompt_index] = d.output
            text, tokens, items = d.text, d.token_ids, []
            if _echo_only(req):
                text, tokens = "", []
            if d.first and req.echo:
                text = self._prompt_text(prompts[d.prompt_index]) + text
                if req.logprobs is not None:
                    items = self._echo_logprobs(req, d.output)
            logprobs = None
            if req.logprobs is not None:
                items += lp.entries(
                    tokens,
                    d.logprobs or [],
                    self.decode_token,
                    as_ids=bool(req.return_tokens_as_token_ids),
                )
                logprobs = lp.completion_logprobs(items, offsets.get(d.index, 0))
            offsets[d.index] = offsets.get(d.index, 0) + len(text)
            choice = {
                "index": d.index,
                "text": text,
                "logprobs": logprobs.model_dump() if logprobs else None,
                "finish_reason": d.finish_reason,
            }
            if req.return_token_ids:  # vLLM's: the prompt's ids with a choice's first chunk
                if d.first:
                    choice["prompt_token_ids"] = list(prompts[d.prompt_index][0])
                choice["token_ids"] = list(tokens)
            if d.finish_reason is not None:
                choice["stop_reason"] = d.stop_reason
                reasons[d.index] = d.finish_reason
            body = dict(base, choices=[choice])
            if continuous:
                body["usage"] = self.usage(latest).model_dump()
            yield body


def _echo_only(req: CompletionRequest) -> bool:
    """echo with max_tokens 0: the answer is the prompt alone."""
    return bool(req.echo) and req.max_tokens == 0
