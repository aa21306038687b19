"""Llama 3.1 / 3.2 JSON format: the answer is ``{"name": ..., "parameters": {...}}`` (optionally
after ``<|python_tag|>``), several calls separated by ``;``."""

from __future__ import annotations

from pagedkv.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ExtractedToolCalls,
    ToolParser,
    json_objects,
    tool_call,
)

_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    markers = (_TAG,)

    def calls_start(self, text: str) -> int | None:
        stripped = text.lstrip()
        if stripped.startswith("{") or (not stripped and text):
            return 0  # a JSON answer from its first character
        return super().calls_start(text) if not stripped or stripped[0] == "<" else None

    def extract(self, text: str) -> ExtractedToolCalls:
        start = text.find(_TAG)
        body = text[start + len(_TAG) :] if start >= 0 else text
        if start < 0 and not body.lstrip().startswith("{"):
            return ExtractedToolCalls(text)
        try:
            calls = [
                tool_call(c["name"], c.get("parameters", c.get("arguments", {})))
                for c in json_objects(body)
            ]
        except (ValueError, KeyError, TypeError):
            return ExtractedToolCalls(text)
        return ExtractedToolCalls(text[:start] or None if start > 0 else None, calls)
