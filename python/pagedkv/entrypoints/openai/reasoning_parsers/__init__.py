"""Reasoning parsers (--reasoning-parser NAME): reasoning_content split from content."""

from __future__ import annotations

from typing import Dict, Type

from pagedkv.entrypoints.openai.reasoning_parsers.deepseek_r1_reasoning_parser import (
    DeepSeekR1ReasoningParser,
)
from pagedkv.entrypoints.openai.reasoning_parsers.qwen3_reasoning_parser import (
    Qwen3ReasoningParser,
)
from pagedkv.entrypoints.openai.reasoning_parsers.think_tag_reasoning_parser import (
    ThinkTagReasoningParser,
)

REASONING_PARSERS: Dict[str, Type[ThinkTagReasoningParser]] = {
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "qwen3": Qwen3ReasoningParser,
}

__all__ = ["REASONING_PARSERS", "ThinkTagReasoningParser"]
