"""Hermes / Qwen 2.5 / Qwen 3 format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
one block per call, after optional content."""

from __future__ import annotations

import json
import re

from pagedkv.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ExtractedToolCalls,
    ToolParser,
    tool_call,
)

_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


class HermesToolParser(ToolParser):
    markers = ("<tool_call>",)

    def extract(self, text: str) -> ExtractedToolCalls:
        start = text.find("<tool_call>")
        if start < 0:
            return ExtractedToolCalls(text)
        try:
            calls = [json.loads(body) for body in _BLOCK.findall(text[start:])]
            parsed = [tool_call(c["name"], c.get("arguments", {})) for c in calls]
        except (ValueError, KeyError, TypeError):
            return ExtractedToolCalls(text)
        return ExtractedToolCalls(text[:start] or None, parsed)
