"""The OpenAI-compatible HTTP server: ``build_app(engine, args)`` and ``run_server(args)``.

Routes: /v1/models, /v1/completions, /v1/chat/completions, /v1/embeddings (OpenAI), /tokenize,
/detokenize, /pooling, /classify, /score, /rerank (serving_pooling.py), /health, /ping,
/version, /metrics (vLLM's extras). With an API key, every /v1 route needs
``Authorization: Bearer <key>``; the operational routes stay open for probes and scrapers.
CORS is open unless --allowed-origins & co restrict it, as in vLLM.
``$PAGEDKV_MAX_N_SEQUENCES`` (default 16384, as vLLM's ``$VLLM_MAX_N_SEQUENCES``) caps the
choices one prompt may ask for (``n``); see limits.py.
"""

from __future__ import annotations

import argparse
import hmac
import logging
import uuid
from typing import Any, List, Optional

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response

import pagedkv
from pagedkv.engine.input_processor import MAX_CLIENT_REQUEST_ID_CHARS, check_request_id
from pagedkv.entrypoints.arg_types import CLIError
from pagedkv.entrypoints.openai.drain import Drain, DrainingServer, DrainMiddleware
from pagedkv.entrypoints.openai.errors import APIError, bad_request, install_error_handlers
from pagedkv.entrypoints.openai.limits import limit_of, request_limits
from pagedkv.entrypoints.openai.metrics import CONTENT_TYPE, ServerMetrics
from pagedkv.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ModelCard,
    ModelList,
    ModelPermission,
    TokenizeRequest,
)
from pagedkv.entrypoints.openai.request_checks import MAX_LOGPROBS
from pagedkv.entrypoints.openai.serving_chat import OpenAIServingChat
from pagedkv.entrypoints.openai.serving_completion import OpenAIServingCompletion
from pagedkv.entrypoints.openai.serving_engine import ServerState
from pagedkv.entrypoints.openai.serving_lora import (
    LoRARegistry,
    add_lora_routes,
    check_adapter,
    parse_lora_module,
)
from pagedkv.entrypoints.openai.serving_pooling import add_pooling_routes, refuse_generation

logger = logging.getLogger("pagedkv.server")


class RequestIdHeaderMiddleware:
    """``--enable-request-id-headers``: every response carries X-Request-Id, the client's own
    when it sent one, else the id the handler gave the request (``cmpl-...``), else a random
    one. Plain ASGI, so streams pass through unbuffered."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = _echoable_request_id(dict(scope["headers"]).get(b"x-request-id"))
        state = scope.setdefault("state", {})

        async def send_with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                rid = given or str(state.get("request_id") or uuid.uuid4().hex).encode()
                message = dict(
                    message, headers=[*message.get("headers", []), (b"x-request-id", rid)]
                )
            await send(message)

        await self.app(scope, receive, send_with_id)


def _echoable_request_id(raw: Optional[bytes]) -> Optional[bytes]:
    """The client's X-Request-Id if it is safe to send back (the handler's own check), else
    None: a refused id (control characters, non-ASCII, too long) is not echoed into the 400's
    headers, whose id then falls back to the handler's or a random one."""
    if raw is None:
        return None
    try:
        check_request_id(raw.decode("latin-1"), "X-Request-Id", MAX_CLIENT_REQUEST_ID_CHARS)
    except ValueError:
        return None
    return raw


class BodySizeLimitMiddleware:
    """``--max-request-body-size``: a body over the limit gets a 413 before it is parsed (a
    24 MB /tokenize body grew the server by 2.3 GB). Checks Content-Length first, then counts
    the bytes as they arrive (a chunked body has no length) and hands the app the body read.
    Plain ASGI, as the others (responses stream through unbuffered)."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _refuse(self, scope: dict, receive: Any, send: Any) -> None:
        error = APIError(
            413,
            f"The request body is larger than this server's limit of "
            f"{self.max_bytes} bytes (--max-request-body-size).",
            type_="invalid_request_error",
            code="request_too_large",
        )
        await error.response()(scope, receive, send)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        chunks, seen = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before sending its body
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body: Optional[bytes] = b"".join(chunks)

        async def replay() -> dict:
            nonlocal body
            if body is None:  # the body was handed over: what comes next (a disconnect)
                return await receive()
            message, body = {"type": "http.request", "body": body, "more_body": False}, None
            return message

        await self.app(scope, replay, send)


def _route_path(scope: dict) -> str:
    """The path the routes see: with --root-path, uvicorn puts the prefix in front of the
    request's path (and a client may send it itself); routing drops it, and so must every
    check on the path, or "/prefix/v1/..." would skip the API key."""
    path, root = scope["path"], scope.get("root_path") or ""
    if root and (path == root or path.startswith(root + "/")):
        return path[len(root) :]
    return path


class ApiKeyMiddleware:
    """Plain ASGI middleware (no BaseHTTPMiddleware: it would buffer and break streaming)."""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and _route_path(scope).startswith("/v1")
            and scope["method"] != "OPTIONS"
        ):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                error = APIError(
                    401,
                    "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
                    code="invalid_api_key",
                )
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


# Other spellings of the embedded default model that requests may use.
_DEFAULT_MODEL_ALIASES = (
    "smollm2",
    "smollm2-135m",
    "smollm2-135m-instruct",
    "default",
    "SmolLM2-135M-Instruct",
    "HuggingFaceTB/SmolLM2-135M-Instruct",
)


def _served_names(engine: Any, args: Any) -> tuple[List[str], List[str]]:
    """(names reported and accepted, other names accepted): vLLM's --served-model-name rule,
    falling back to the MODEL argument, then to the engine's own name for its model."""
    mc = engine.model_config
    model_arg = getattr(args, "model", None)
    engine_names = [getattr(mc, a, None) for a in ("served_model_name", "model", "name")]
    names = getattr(args, "served_model_name", None)
    if isinstance(names, str):
        names = [names]
    names = [n for n in (names or []) if n]
    if not names:
        names = [next((n for n in [model_arg, *engine_names] if n), "default")]
    aliases = [a for a in (model_arg, *engine_names) if a]
    if model_arg is None or model_arg.lower() in {a.lower() for a in _DEFAULT_MODEL_ALIASES}:
        aliases += _DEFAULT_MODEL_ALIASES
    return names, [a for a in dict.fromkeys(aliases) if a not in names]


def expand_images(engine: Any, ids: List[int], images: List[Any]) -> List[int]:
    """A chat prompt's token ids with its images' placeholders, as the engine's input
    processor expands them (a 400 naming the messages for a refused image)."""
    try:
        return engine.input_processor.images.process(ids, {"image": images}, "messages")[0]
    except (ValueError, TypeError) as exc:
        raise bad_request(str(exc), param="messages") from exc


def _engine_config(engine: Any) -> Any:
    """The EngineConfig under an AsyncLLMEngine (None for a stand-in without one)."""
    return getattr(getattr(engine, "engine", None), "config", None)


def _max_logprobs(engine: Any) -> int:
    """The engine's logprobs cap (--max-logprobs; -1: the vocabulary), which the server's
    checks use so that a request is judged as the engine would judge it."""
    config = _engine_config(engine)
    cap = getattr(config, "max_logprobs", None)
    if not isinstance(cap, int):
        return MAX_LOGPROBS
    vocab = int(getattr(engine.model_config, "vocab_size", 0) or 0)
    return vocab if cap == -1 else min(cap, vocab) if vocab else cap


def auto_tool_parser(args: Any) -> Optional[str]:
    """The --tool-call-parser that tool_choice "auto" uses, when --enable-auto-tool-choice."""
    parser = getattr(args, "tool_call_parser", None)
    if getattr(args, "enable_auto_tool_choice", False):
        if parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser")
        return str(parser)
    return None


def build_app(engine: Any, args: Any = None) -> FastAPI:
    """The FastAPI app serving ``engine`` (an AsyncLLMEngine)."""
    args = args if args is not None else argparse.Namespace()
    names, aliases = _served_names(engine, args)
    state = ServerState(
        engine=engine,
        served_model_names=names,
        model_aliases=aliases,
        max_model_len=int(engine.model_config.max_model_len),
        chat_template=getattr(args, "chat_template", None),
        metrics=ServerMetrics(engine, names[0], int(engine.model_config.max_model_len)),
        limits=request_limits(args),
        response_role=getattr(args, "response_role", None) or "assistant",
        max_logprobs=_max_logprobs(engine),
        trust_request_chat_template=bool(getattr(args, "trust_request_chat_template", False)),
        allowed_media_domains=getattr(args, "allowed_media_domains", None),
        allowed_local_media_path=getattr(_engine_config(engine), "allowed_local_media_path", None),
        tool_call_parser=auto_tool_parser(args),
        reasoning_parser=getattr(args, "reasoning_parser", None),
        lora=LoRARegistry(engine, reserved=[*names, *aliases]),
    )
    for text in getattr(args, "lora_modules", None) or []:
        try:
            check_adapter(engine, state.lora.add(parse_lora_module(text)))
        except (ValueError, OSError) as exc:  # a flag value: reported as argparse would
            raise CLIError("--lora-modules", str(exc)) from exc
    app = FastAPI(title="pagedkv OpenAI-compatible server", version=pagedkv.__version__)
    app.state.pagedkv = state
    install_error_handlers(app)
    api_key: Optional[str] = getattr(args, "api_key", None)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    if getattr(args, "enable_request_id_headers", False):
        app.add_middleware(RequestIdHeaderMiddleware)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=limit_of(args, "max_request_body_size"))
    # SIGTERM drains the server (drain.py): outside the API key and size checks, inside CORS.
    app.state.drain = Drain(float(getattr(args, "shutdown_timeout", 20.0)))
    app.add_middleware(DrainMiddleware, drain=app.state.drain)
    # CORS outermost (added last), as vLLM has it, so that preflights and even 401 answers
    # carry the Access-Control-* headers a browser needs to read them.
    app.add_middleware(
        CORSMiddleware,
        allow_origins=getattr(args, "allowed_origins", None) or ["*"],
        allow_credentials=bool(getattr(args, "allow_credentials", False)),
        allow_methods=getattr(args, "allowed_methods", None) or ["*"],
        allow_headers=getattr(args, "allowed_headers", None) or ["*"],
    )
    completion = OpenAIServingCompletion(state)
    chat = OpenAIServingChat(state)
    # vLLM's ModelCard.root: what was loaded (the MODEL argument / path).
    root = getattr(args, "model", None) or getattr(engine.model_config, "model", None) or names[0]

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        cards = [
            ModelCard(
                id=n, root=root, max_model_len=state.max_model_len, permission=[ModelPermission()]
            )
            for n in names
        ]
        listing = ModelList(data=cards).model_dump()
        listing["data"] += state.lora.cards(names[0], state.max_model_len)
        return JSONResponse(listing)

    add_lora_routes(app, state.lora)
    add_pooling_routes(app, state)  # /v1/embeddings, /pooling, /classify, /score, /rerank

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, raw: Request) -> Response:
        refuse_generation(state, "/v1/completions")
        return await completion.create(req, raw)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, raw: Request) -> Response:
        refuse_generation(state, "/v1/chat/completions")
        return await chat.create(req, raw)

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> JSONResponse:
        completion.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise bad_request("give exactly one of prompt or messages", param="prompt")
        # Bounded as generation requests are: a text that could not fit the context is refused
        # by its length before it is tokenized.
        if req.messages is not None:
            chat.check_length(chat.messages_chars(req.messages), "messages")
            template, template_vars = chat.template_settings(req)
            images = chat.chat_images()  # a model that reads images: its image_url parts
            # The chat template renders off the event loop too (a long conversation is slow).
            text = await completion.in_count_thread(
                chat.render,
                req.messages,
                template,
                req.add_generation_prompt,
                template_vars,
                req.continue_final_message,
                images,
            )
            ids = await completion.encode_async(text, bool(req.add_special_tokens), param=None)
            if images is not None and images.images:
                # The tokens the model reads: each image token expanded into its placeholders,
                # as a chat request's prompt is (count and max_model_len then compare).
                ids = await completion.in_count_thread(expand_images, engine, ids, images.images)
        else:
            special = True if req.add_special_tokens is None else req.add_special_tokens
            completion.check_length(len(req.prompt or ""), "prompt")
            ids = await completion.encode_async(req.prompt or "", special, param=None)
        body: dict = {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids}
        if req.return_token_strs:
            body["token_strs"] = await completion.in_count_thread(
                engine.tokenizer.convert_ids_to_tokens, ids
            )
        return JSONResponse(body)

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest) -> JSONResponse:
        completion.check_model(req.model)
        if len(req.tokens) > state.max_model_len:  # no text the model made is longer
            raise bad_request(
                f"tokens may hold at most max_model_len ({state.max_model_len}) "
                f"token ids, got {len(req.tokens)}",
                param="tokens",
            )
        if req.tokens:
            completion.check_ids(req.tokens, "tokens")
        text = await completion.in_count_thread(completion.decode, req.tokens)
        return JSONResponse({"prompt": text})

    @app.get("/health")
    async def health() -> Response:
        if engine.is_dead:  # why: a device error, or the loop itself failing
            reason = getattr(engine, "dead_reason", None)
            return APIError(503, reason or f"engine loop died: {engine.dead_error!r}").response()
        return Response(status_code=200)

    # vLLM's /ping (SageMaker's health probe), GET and POST: /health's answer.
    for method in ("GET", "POST"):  # one OpenAPI operation id each (the fuzzer reads them)
        app.add_api_route("/ping", health, methods=[method], operation_id=f"ping_{method}")

    @app.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": pagedkv.__version__})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    return app


def run_server(args: argparse.Namespace) -> int:
    """Loads the model, then serves until Ctrl-C, or until SIGTERM has drained it (exit 0)."""
    import uvicorn

    from pagedkv.engine.async_llm_engine import AsyncLLMEngine

    engine = AsyncLLMEngine.from_engine_args(args)
    try:
        app = build_app(engine, args)
    except BaseException:
        engine.shutdown()  # (its thread would keep the process, and the C++ objects, alive)
        raise
    state = app.state.pagedkv
    shown_host = "localhost" if args.host in ("0.0.0.0", "::", "") else args.host
    logger.info(
        "serving model %s (max_model_len %d) at http://%s:%d/v1  "
        "(health: /health, metrics: /metrics%s)",
        state.model_name,
        state.max_model_len,
        shown_host,
        args.port,
        ", API key required" if args.api_key else "",
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.uvicorn_log_level,
        timeout_graceful_shutdown=5,
        access_log=not getattr(args, "disable_uvicorn_access_log", False),
        root_path=getattr(args, "root_path", None) or "",
    )
    try:
        DrainingServer(config, app.state.drain, engine).run()
    finally:
        engine.shutdown()
    return 0
