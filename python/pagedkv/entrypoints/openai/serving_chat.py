"""POST /v1/chat/completions: messages -> the chat template -> one generation request."""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable, Dict, List, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from pagedkv.engine.multimodal import ChatImages, check_chat_part
from pagedkv.entrypoints.openai import logprobs as lp
from pagedkv.entrypoints.openai.errors import APIError, bad_request
from pagedkv.entrypoints.openai.protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogProbs,
    ChatMessage,
    ResponseMessage,
    UsageInfo,
    dump,
)
from pagedkv.entrypoints.openai.reasoning_parsers import REASONING_PARSERS
from pagedkv.entrypoints.openai.request_checks import is_unset, no_tool_choice
from pagedkv.entrypoints.openai.request_timer import RequestTimer
from pagedkv.entrypoints.openai.serving_beam_search import beam_jobs, start_beam_searches
from pagedkv.entrypoints.openai.serving_engine import OpenAIServing
from pagedkv.entrypoints.openai.streaming import cancel_on_disconnect
from pagedkv.entrypoints.openai.tool_calls import (
    ToolChoice,
    history_fields,
    tool_call_id,
    tool_choice_of,
)


def _text_only(value: Any) -> bool:
    return value is None or value == ["text"]


# Chat fields pagedkv does not implement (see UNSUPPORTED in serving_engine.py): the legacy
# functions, audio output and web search (tools: tool_calls.py).
_CHAT_UNSUPPORTED: Dict[str, Callable[[Any], bool]] = {
    "modalities": _text_only,
    "audio": is_unset,
    "web_search_options": lambda value: value is None,  # {} asks for the default search
    "functions": is_unset,
    "function_call": no_tool_choice,
}

# chat_template_kwargs keys that the rendering call itself owns.
_RESERVED_TEMPLATE_KWARGS = ("messages", "conversation", "tokenize", "return_dict")


def message_dicts(
    messages: List[ChatMessage], images: Optional[ChatImages] = None
) -> List[Dict[str, Any]]:
    """OpenAI messages -> the plain {role, content: str} dicts chat templates expect.
    ``images``: for a model that reads images, gathers the image_url parts (each becomes the
    image token in the text); without it they are refused by name."""
    result = []
    arch = images.architecture if images is not None else None
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            texts = []
            for k, part in enumerate(content):
                try:
                    check_chat_part(part.type, f"messages[{i}].content", arch)
                    if images is not None and part.type == "image_url":
                        texts.append(images.take(part, f"messages[{i}].content[{k}]"))
                        continue
                except ValueError as e:
                    raise bad_request(str(e), param=f"messages.{i}.content") from e
                if part.type != "text" or part.text is None:
                    raise bad_request(
                        f"messages[{i}].content: only text parts are supported, "
                        f"got type {part.type!r}",
                        param=f"messages.{i}.content",
                    )
                texts.append(part.text)
            content = "\n".join(texts)
        entry: Dict[str, Any] = {"role": m.role, "content": content or ""}
        if m.name:
            entry["name"] = m.name
        entry.update(history_fields(m))
        result.append(entry)
    return result


class OpenAIServingChat(OpenAIServing):
    def chat_images(self) -> Optional[ChatImages]:
        """A collector of a conversation's images when the model reads images, else None."""
        processor = getattr(self.engine, "input_processor", None)
        reader = getattr(processor, "images", None)
        if reader is None or self.tokenizer is None:
            return None
        return ChatImages(
            getattr(processor, "architecture", None),
            reader.chat_image_text(self.tokenizer),
            self.state.allowed_media_domains,
            self.state.limits.max_image_pixels,
            local_media_path=self.state.allowed_local_media_path,
            max_images=reader.max_images,
        )

    def check_template(self, template: Optional[str]) -> None:
        """vLLM's rule: a request's own chat_template only with --trust-request-chat-template.
        A template is code the server runs (the sandbox bounds each range, not their nesting:
        two nested loops keep a thread busy for hours)."""
        if template is not None and not self.state.trust_request_chat_template:
            raise bad_request(
                "Chat template is passed with request, but "
                "--trust-request-chat-template is not set. Refused request with "
                "untrusted chat template.",
                param="chat_template",
            )

    @staticmethod
    def messages_chars(messages: List[ChatMessage]) -> int:
        """Characters of the conversation's text: its rendered prompt has at least as many."""
        return sum(
            len(m.content)
            if isinstance(m.content, str)
            else sum(len(p.text or "") for p in m.content or [])
            for m in messages
        )

    def render(
        self,
        messages: List[ChatMessage],
        template: Optional[str],
        add_generation_prompt: bool = True,
        template_vars: Optional[Dict[str, Any]] = None,
        continue_final_message: bool = False,
        images: Optional[ChatImages] = None,
    ) -> str:
        """The prompt of a conversation. ``template_vars``: request settings the template may
        read (reasoning_effort), given only when set so that a template's own defaults hold.
        ``images`` gathers the conversation's images (see message_dicts)."""
        if not messages:
            raise bad_request("messages must not be empty", param="messages")
        dicts = message_dicts(messages, images)
        try:
            return self.tokenizer.apply_chat_template(
                dicts,
                chat_template=template or self.state.chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **({"continue_final_message": True} if continue_final_message else {}),
                **{k: v for k, v in (template_vars or {}).items() if v is not None},
            )
        except APIError:
            raise
        except Exception as exc:  # noqa: BLE001 - template errors are the request's fault
            raise bad_request(
                f"could not apply the chat template: {exc}", param="messages"
            ) from exc

    def template_settings(self, req: Any) -> tuple[Optional[str], Dict[str, Any]]:
        """(template, template variables) of a request, as vLLM merges them: chat_template_kwargs
        may also set chat_template, add_generation_prompt and continue_final_message (written
        back to ``req``, which the answer's role depends on)."""
        kwargs = dict(req.chat_template_kwargs or {})
        reserved = sorted(set(kwargs) & set(_RESERVED_TEMPLATE_KWARGS))
        if reserved:
            raise bad_request(
                f"chat_template_kwargs may not set {', '.join(reserved)}",
                param="chat_template_kwargs",
            )
        template = kwargs.pop("chat_template", None) or req.chat_template
        self.check_template(template)
        req.add_generation_prompt = bool(
            kwargs.pop("add_generation_prompt", req.add_generation_prompt)
        )
        req.continue_final_message = bool(
            kwargs.pop("continue_final_message", req.continue_final_message)
        )
        if req.continue_final_message and req.add_generation_prompt:  # vLLM's check and words
            raise bad_request(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                param="continue_final_message",
            )
        return template, {
            "reasoning_effort": getattr(req, "reasoning_effort", None),
            "documents": req.documents,
            **kwargs,
        }

    def echoed(self, req: ChatCompletionRequest) -> str:
        """vLLM's chat echo: the last message's text when it has the answer's role (the answer
        continues it), else nothing."""
        if not req.echo or req.messages[-1].role != self.role(req):
            return ""
        return str(message_dicts(req.messages[-1:])[0]["content"])

    def role(self, req: ChatCompletionRequest) -> str:
        """vLLM's rule: --response-role when the template opened a new turn, else the role of
        the message the model continues."""
        return self.state.response_role if req.add_generation_prompt else req.messages[-1].role

    async def create(self, req: ChatCompletionRequest, raw: Request) -> Response:
        self.check_model(req.model)
        self.check_n(req.n)
        self.check_request(req, handled=(*_CHAT_UNSUPPORTED, "tools", "tool_choice"))
        self.check_supported(req, _CHAT_UNSUPPORTED)
        self.check_logprobs(req.top_logprobs, "top_logprobs")
        if req.top_logprobs and not req.logprobs:  # vLLM's rule and words
            raise bad_request(
                "when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs"
            )
        # The rendered prompt is at least as long as its messages' text: reject a conversation
        # that cannot fit before rendering and tokenizing it.
        keep_last = self.truncation(req)
        if keep_last is None:
            self.check_length(self.messages_chars(req.messages), "messages")
        template, template_vars = self.template_settings(req)
        tools = tool_choice_of(req, self.state.tool_call_parser)
        if tools is not None:  # the template shows the tools, whatever the choice
            template_vars["tools"] = [{"type": "function", "function": f} for f in tools.tools]
        images = self.chat_images()
        # Off the event loop: /health and the streams keep going while a template renders
        # (and images decode).
        prompt = await self.in_tokenizer_thread(
            self.render,
            req.messages,
            template,
            req.add_generation_prompt,
            template_vars,
            req.continue_final_message,
            images,
        )
        # The template already wrote any BOS / special tokens (add_special_tokens: false, as
        # in vLLM, unless the client asks for them).
        ids = await self.encode_async(prompt, req.add_special_tokens, "messages", keep_last)
        self.check_ids(ids, "messages")
        # max_completion_tokens replaces the deprecated max_tokens; 0 is a value, not "unset".
        length_field = "max_completion_tokens"
        requested = req.max_completion_tokens
        if requested is None:
            length_field, requested = "max_tokens", req.max_tokens
        max_tokens = self.max_tokens_for(len(ids), requested, length_field, "messages")
        beams = beam_jobs(self, req, [(ids, prompt)], requested, length_field, "messages")
        mm = images.images if images is not None else None
        if beams is not None and mm:
            raise bad_request(
                "use_beam_search is not supported with image inputs", param="use_beam_search"
            )
        if beams is not None:
            if tools is not None and tools.calls:
                raise bad_request(
                    "tool_choice required / named is not supported with use_beam_search",
                    param="tool_choice",
                )
            return await self._beam_search(req, raw, beams, tools)
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = self.sampling_params(
            req,
            max_tokens,
            logprobs,
            req.prompt_logprobs,
            fields={"logprobs": "top_logprobs", "max_tokens": length_field},
        )
        if tools is not None and tools.calls:
            if params.structured_outputs is not None:
                raise bad_request(
                    "tool_choice required / named cannot be combined with "
                    "response_format or structured outputs",
                    param="tool_choice",
                )
            params.structured_outputs = tools.constraint()
        request_id, engine_id = self.request_ids(raw, req, "chatcmpl")
        self.log_request(request_id, [len(ids)], params, bool(req.stream))
        timer = RequestTimer(self.state.metrics, request_id)
        # The images ride in the prompt dict; the input processor expands their tokens.
        item: Any = {"prompt": prompt, "multi_modal_data": {"image": mm}} if mm else prompt
        streams = await self.start_all(
            engine_id,
            [(ids, item, params)],
            req.priority,
            prompt_param="messages",
            model=req.model,
        )
        if req.stream:
            return StreamingResponse(
                self._stream(req, request_id, streams, timer, ids, tools),
                media_type="text/event-stream",
            )
        result = await cancel_on_disconnect(raw, self._full(req, request_id, streams, timer, tools))
        if result is None:
            return Response(status_code=499)
        return JSONResponse(dump(result))

    async def _beam_search(
        self,
        req: ChatCompletionRequest,
        raw: Request,
        beams: List[tuple],
        tools: Optional[ToolChoice],
    ) -> Response:
        """use_beam_search (serving_beam_search.py): the n best hypotheses as the choices."""
        request_id, engine_id = self.request_ids(raw, req, "chatcmpl")
        self.log_request(request_id, [len(beams[0][0])], beams[0][2], False)
        timer = RequestTimer(self.state.metrics, request_id)
        streams = start_beam_searches(self, engine_id, beams, req)
        result = await cancel_on_disconnect(raw, self._full(req, request_id, streams, timer, tools))
        if result is None:
            return Response(status_code=499)
        return JSONResponse(dump(result))

    def _logprobs(
        self, req: ChatCompletionRequest, token_ids: List[int], tables: Optional[List[Any]]
    ) -> Optional[ChatLogProbs]:
        if not req.logprobs:
            return None
        items = lp.entries(
            token_ids,
            tables or [],
            self.decode_token,
            top_n=req.top_logprobs or 0,
            as_ids=bool(req.return_tokens_as_token_ids),
        )
        return ChatLogProbs(content=lp.chat_logprobs(items))

    def _message(
        self, req: ChatCompletionRequest, text: str, tools: Optional[ToolChoice]
    ) -> ResponseMessage:
        reasoning = None
        if self.state.reasoning_parser is not None:
            reasoning, rest = REASONING_PARSERS[self.state.reasoning_parser]().split(text)
            text = rest or ""
        if tools is None:
            return ResponseMessage(role=self.role(req), content=text, reasoning_content=reasoning)
        content, calls = tools.answer(text)
        return ResponseMessage(
            role=self.role(req), content=content, tool_calls=calls, reasoning_content=reasoning
        )

    async def _full(
        self,
        req: ChatCompletionRequest,
        request_id: str,
        streams: List[Any],
        timer: RequestTimer,
        tools: Optional[ToolChoice] = None,
    ) -> ChatCompletionResponse:
        try:
            (out,) = await self.finals(streams, timer)
        finally:
            for s in streams:
                s.close()
        echo = self.echoed(req)
        choices = [
            ChatChoice(
                index=c.index,
                message=self._message(req, echo + c.text, tools),
                logprobs=self._logprobs(req, c.token_ids, c.logprobs),
                finish_reason=_finish(tools, c.finish_reason, c.text),
                stop_reason=getattr(c, "stop_reason", None),
                token_ids=list(c.token_ids) if req.return_token_ids else None,
            )
            for c in sorted(out.outputs, key=lambda c: c.index)
        ]
        usage = self.usage([out])
        timer.done(
            usage.completion_tokens, [c.finish_reason for c in choices], usage.prompt_tokens, [out]
        )
        return ChatCompletionResponse(
            id=request_id,
            model=self.response_model(req.model),
            choices=choices,
            usage=usage,
            prompt_logprobs=lp.prompt_logprobs(
                getattr(out, "prompt_logprobs", None), self.decode_token
            ),
            prompt_token_ids=list(out.prompt_token_ids) if req.return_token_ids else None,
        )

    def _stream(
        self,
        req: ChatCompletionRequest,
        request_id: str,
        streams: List[Any],
        timer: RequestTimer,
        prompt_ids: List[int],
        tools: Optional[ToolChoice] = None,
    ) -> AsyncIterator[str]:
        base, include_usage, continuous = self.stream_head(req, request_id, "chat.completion.chunk")
        latest: List[Any] = [None]
        reasons: List[Optional[str]] = [None] * req.n  # by choice index
        bodies = self._chunks(
            req, base, streams, timer, latest, reasons, continuous, prompt_ids, tools
        )
        return self.sse(
            request_id, bodies, streams, timer, latest, reasons, base if include_usage else None
        )

    async def _chunks(
        self,
        req: ChatCompletionRequest,
        base: Dict[str, Any],
        streams: List[Any],
        timer: RequestTimer,
        latest: List[Any],
        reasons: List[Optional[str]],
        continuous: bool,
        prompt_ids: List[int],
        tools: Optional[ToolChoice] = None,
    ) -> AsyncIterator[Dict[str, Any]]:
        prompt_tokens = len(prompt_ids)

        def opening(i: int, delta: Dict[str, Any]) -> Dict[str, Any]:
            """A chunk sent before the model's tokens: with continuous usage stats it carries
            the prompt's usage, as vLLM's does."""
            body = dict(
                base,
                choices=[{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}],
            )
            if continuous:
                body["usage"] = UsageInfo(
                    prompt_tokens=prompt_tokens, total_tokens=prompt_tokens
                ).model_dump()
            return body

        # The role comes first, in a chunk of its own per choice, as OpenAI sends it.
        for i in range(req.n):
            body = opening(i, {"role": self.role(req), "content": ""})
            if req.return_token_ids and i == 0:  # vLLM's: with the first chunk
                body["prompt_token_ids"] = list(prompt_ids)
            yield body
        echo = self.echoed(req)
        for i in range(req.n if echo else 0):  # then the echoed text, as vLLM streams it
            yield opening(i, {"content": echo})
        calls = _StreamedCalls(tools) if tools is not None and tools.mode != "none" else None
        name = self.state.reasoning_parser
        thoughts = _StreamedReasoning(REASONING_PARSERS[name]()) if name else None
        async for d in self.deltas(streams, req.n, timer):
            latest[0] = d.output
            logprobs = self._logprobs(req, d.token_ids, d.logprobs)
            text, thought = d.text, ""
            if thoughts is not None:
                thought, text = thoughts.delta(d.index, d.text, d.finish_reason is not None)
            delta: Dict[str, Any] = (
                {"content": text} if text or (d.finish_reason is None and not thought) else {}
            )
            finish_reason = d.finish_reason
            if calls is not None:
                delta, finish_reason = calls.delta(d.index, text, d.finish_reason)
            if thought:
                delta["reasoning_content"] = thought
            choice = {
                "index": d.index,
                "delta": delta,
                "logprobs": logprobs.model_dump() if logprobs else None,
                "finish_reason": finish_reason,
            }
            if req.return_token_ids:
                choice["token_ids"] = list(d.token_ids)
            if d.finish_reason is not None:
                # As in the non-streamed answer and streamed completions.
                choice["stop_reason"] = d.stop_reason
                reasons[d.index] = finish_reason
            body = dict(base, choices=[choice])
            if continuous:
                body["usage"] = self.usage(latest).model_dump()
            yield body


class _StreamedReasoning:
    """Per choice: the (reasoning, content) pieces new in each streamed chunk."""

    def __init__(self, parser: Any) -> None:
        self.parser = parser
        self.text: Dict[int, str] = {}
        self.sent: Dict[int, tuple] = {}

    def delta(self, index: int, text: str, final: bool) -> tuple[str, str]:
        full = self.text[index] = self.text.get(index, "") + text
        reasoning, content = self.parser.split(full, final=final)
        r_sent, c_sent = self.sent.get(index, (0, 0))
        reasoning, content = reasoning or "", content or ""
        self.sent[index] = (max(r_sent, len(reasoning)), max(c_sent, len(content)))
        return reasoning[r_sent:], content[c_sent:]


def _finish(tools: Optional[ToolChoice], reason: Optional[str], text: str) -> Optional[str]:
    if tools is None or tools.mode == "none":
        return reason
    return tools.finish_reason(reason, bool(tools.answer(text)[1]))


class _StreamedCalls:
    """Streamed tool calls, as OpenAI sends them. A named function's call opens with its id
    and name (empty arguments), then its arguments arrive piece by piece. `required` answers (a
    JSON array, parsed only when complete) arrive whole at the end, one entry per call. `auto`:
    text streams as content until the parser sees where tool calls may begin; from there it is
    held back, and at the end goes out as tool calls (or as content, when it holds none)."""

    def __init__(self, tools: ToolChoice) -> None:
        self.tools = tools
        self.opened: set = set()  # choice indexes whose named call has begun
        self.text: Dict[int, str] = {}
        self.sent: Dict[int, int] = {}  # auto: characters already sent as content

    def delta(
        self, index: int, text: str, finish: Optional[str]
    ) -> tuple[Dict[str, Any], Optional[str]]:
        """(the chunk's delta, its finish_reason) for new text of choice ``index``."""
        tools = self.tools
        if tools.mode == "named":
            call: Dict[str, Any] = {"index": 0, "function": {"arguments": text}}
            if index not in self.opened:
                self.opened.add(index)
                call.update(id=tool_call_id(), type="function")
                call["function"]["name"] = tools.name
            return (
                {"tool_calls": [call]} if text or len(call) > 2 else {},
                tools.finish_reason(finish, True),
            )
        full = self.text[index] = self.text.get(index, "") + text
        if finish is None:
            if tools.mode == "required":
                return {}, None
            start = tools.parser.calls_start(full)  # type: ignore[union-attr]
            safe = len(full) if start is None else start
            sent = self.sent.get(index, 0)
            self.sent[index] = max(sent, safe)
            return ({"content": full[sent:safe]} if safe > sent else {}), None
        content, found = tools.answer(full)
        sent = self.sent.get(index, 0)
        delta: Dict[str, Any] = {}
        rest = (content or "")[sent:] if found else full[sent:]
        if rest:
            delta["content"] = rest
        if found:
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(found)]
        return delta, tools.finish_reason(finish, bool(found))
