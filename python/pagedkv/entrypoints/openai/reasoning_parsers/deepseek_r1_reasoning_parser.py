"""DeepSeek-R1: everything up to ``</think>`` is reasoning (the template opens <think>)."""

from __future__ import annotations

from pagedkv.entrypoints.openai.reasoning_parsers.think_tag_reasoning_parser import (
    ThinkTagReasoningParser,
)


class DeepSeekR1ReasoningParser(ThinkTagReasoningParser):
    open_by_default = True
