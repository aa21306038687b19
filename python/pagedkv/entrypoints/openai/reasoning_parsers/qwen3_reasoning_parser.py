"""Qwen3: reasoning only inside a ``<think>...</think>`` that opens the answer."""

from __future__ import annotations

from pagedkv.entrypoints.openai.reasoning_parsers.think_tag_reasoning_parser import (
    ThinkTagReasoningParser,
)


class Qwen3ReasoningParser(ThinkTagReasoningParser):
    open_by_default = False
