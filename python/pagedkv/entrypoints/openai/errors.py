"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with the right status.

Every failure the server reports goes through :class:`APIError` so that clients (the `openai`
package raises ``BadRequestError`` / ``AuthenticationError`` / ``NotFoundError`` from the
status) see one format, including FastAPI's own validation errors, which are 422 by default
and become 400 here as OpenAI and vLLM answer.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, Optional, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pagedkv.engine.async_llm_engine import EngineDeadError
from pagedkv.entrypoints.openai.protocol import InvalidUnicode

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    500: "internal_server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: Optional[str] = None,
        type_: Optional[str] = None,
        code: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type_ or _TYPES.get(status, "invalid_request_error")
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code if self.code is not None else self.status,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)

    def sse(self) -> str:
        """The error as a server-sent event, for failures after a stream has started."""
        return f"data: {json.dumps(self.body())}\n\n"


def bad_request(message: str, param: Optional[str] = None) -> APIError:
    return APIError(400, message, param=param)


# The identifier a validation message starts with: "top_p must be in (0, 1], got 1.5".
_LEADING_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\b")


def field_named_in(message: str, fields: Dict[str, str]) -> Optional[str]:
    """The request field a validation message is about: the message's leading identifier (the
    argument SamplingParams / the engine names first) mapped by ``fields`` to the request field
    it came from; None when it names none of them. Only the whole leading word counts, so
    "top_p must be ..." is about top_p although it contains "n" and "p"."""
    m = _LEADING_NAME.match(message)
    return fields.get(m.group(1)) if m else None


def _validation_message(exc: RequestValidationError) -> tuple[str, Optional[str]]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"malformed JSON body: {first.get('msg', '')}", None
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, InvalidUnicode):  # the message must not repeat the bad string
        return str(cause), cause.param or None
    param = ".".join(_field_path([e.get("loc", ()) for e in errors])) or None
    msgs = []
    for e in errors[:5]:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
        msgs.append(f"{where}: {e.get('msg')}" if where else str(e.get("msg")))
    return "; ".join(msgs), param


def _field_path(locs: Sequence[Sequence[Any]]) -> list[str]:
    """The request field pydantic's errors are about: the path the first error's location
    shares with the others', without "body" or union-member tags ("str", "list[int]"). A value
    that fits no member of a union (prompt: null) fails once per member, all under the field."""
    first = [str(p) for p in locs[0] if p != "body"]
    common = len(first)
    for loc in locs[1:]:
        other = [str(p) for p in loc if p != "body"]
        same = 0
        while same < min(common, len(other)) and first[same] == other[same]:
            same += 1
        common = same
    path = first[:common] if common else first[:1]
    return [p for p in path if not _UNION_TAG.match(p)]


# How pydantic names a union member in an error location.
_UNION_TAG = re.compile(
    r"^(str|int|float|bool|none|list\[.*\]|dict\[.*\]|function-.*|"
    r"[a-z_]+\[.*\])$"
)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return APIError(400, message, param=param).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return APIError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(EngineDeadError)
    async def _dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        return APIError(503, str(exc)).response()

    @app.exception_handler(ValueError)
    async def _value(_: Request, exc: ValueError) -> JSONResponse:
        # Engine / SamplingParams validation: the message names the offending field.
        return APIError(400, str(exc)).response()

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        # Anything else is the server's failure: still an OpenAI-style JSON error (clients
        # parse it), not Starlette's text/plain "Internal Server Error". The traceback goes to
        # the log (Starlette logs it after this handler answers).
        return APIError(500, f"{type(exc).__name__}: {exc}").response()
