"""Mistral format: ``[TOOL_CALLS]`` then a JSON array of {"name", "arguments"} objects, or (newer
tokenizers) ``[TOOL_CALLS]name[ARGS]{...}`` per call."""

from __future__ import annotations

import json

from pagedkv.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ExtractedToolCalls,
    ToolParser,
    tool_call,
)

_BOT = "[TOOL_CALLS]"
_ARGS = "[ARGS]"


class MistralToolParser(ToolParser):
    markers = (_BOT,)

    def extract(self, text: str) -> ExtractedToolCalls:
        start = text.find(_BOT)
        if start < 0:
            return ExtractedToolCalls(text)
        content = text[:start] or None
        try:
            return ExtractedToolCalls(content, self._calls(text[start:]))
        except (ValueError, KeyError, TypeError):
            return ExtractedToolCalls(text)

    @staticmethod
    def _calls(section: str) -> list:
        parts = [p for p in section.split(_BOT) if p.strip()]
        calls = []
        for part in parts:
            if _ARGS in part:  # name[ARGS]{...}
                name, args = part.split(_ARGS, 1)
                calls.append(tool_call(name.strip(), json.loads(args)))
                continue
            items = json.loads(part)
            for item in items if isinstance(items, list) else [items]:
                calls.append(tool_call(item["name"], item.get("arguments", {})))
        if not calls:
            raise ValueError("no tool call")
        return calls
