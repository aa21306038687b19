"""A request's output constraint as StructuredOutputsParams: OpenAI's ``response_format``
(``json_object``, ``json_schema``), vLLM's ``structured_outputs`` object and its older
``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar`` fields. At most one
may be set; a malformed one is a 400 naming the field (the grammar compiler's own refusal comes
later, from the InputProcessor, also as a 400)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from pagedkv.engine.structured_output import StructuredOutputsParams
from pagedkv.entrypoints.openai.errors import bad_request

# vLLM's guided_* request fields -> the StructuredOutputsParams field each sets.
_GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
# Request fields that are part of this concept (request_checks leaves them to this module).
FIELDS = ("response_format", "structured_outputs", *_GUIDED)


def structured_outputs_of(req: Any) -> Optional[StructuredOutputsParams]:
    """The constraint the request sets, or None (no field, or response_format text)."""
    found = [
        spec
        for spec in (_from_response_format(req), _from_structured(req), *_from_guided(req))
        if spec is not None
    ]
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise bad_request(
            f"set at most one of response_format, structured_outputs and the "
            f"guided_* fields (got {names})",
            param=found[1][0],
        )
    if not found:
        return None
    name, kwargs = found[0]
    if getattr(req, "guided_whitespace_pattern", None) is not None:
        raise bad_request(
            "guided_whitespace_pattern is not supported", param="guided_whitespace_pattern"
        )
    try:
        return StructuredOutputsParams(**kwargs)
    except (TypeError, ValueError) as exc:
        raise bad_request(f"{name}: {exc}", param=name) from None


Found = Optional[Tuple[str, Dict[str, Any]]]


def _from_response_format(req: Any) -> Found:
    fmt = getattr(req, "response_format", None)
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_request(
            "response_format must be {'type': 'text' | 'json_object' | 'json_schema', ...}",
            param="response_format",
        )
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return "response_format", {"json_object": True}
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise bad_request(
            "response_format json_schema needs a json_schema object with a 'schema' object",
            param="response_format",
        )
    # OpenAI's json_schema without a schema: any JSON object.
    schema = spec.get("schema")
    return "response_format", ({"json": schema} if schema is not None else {"json_object": True})


def _from_structured(req: Any) -> Found:
    value = getattr(req, "structured_outputs", None)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request("structured_outputs must be an object", param="structured_outputs")
    known = set(StructuredOutputsParams.__dataclass_fields__)
    unknown = sorted(set(value) - known)
    if unknown:
        raise bad_request(
            f"structured_outputs has unknown fields: {', '.join(unknown)}",
            param="structured_outputs",
        )
    return "structured_outputs", dict(value)


def _from_guided(req: Any) -> list:
    out = []
    for name, field in _GUIDED.items():
        value = getattr(req, name, None)
        if value is not None:
            out.append((name, {field: value}))
    return out
