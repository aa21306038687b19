"""Tool-call parsers for tool_choice "auto" (--tool-call-parser NAME), one file per format."""

from __future__ import annotations

from typing import Dict, Type

from pagedkv.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ExtractedToolCalls,
    ToolParser,
)
from pagedkv.entrypoints.openai.tool_parsers.hermes_tool_parser import HermesToolParser
from pagedkv.entrypoints.openai.tool_parsers.llama3_json_tool_parser import (
    Llama3JsonToolParser,
)
from pagedkv.entrypoints.openai.tool_parsers.mistral_tool_parser import MistralToolParser
from pagedkv.entrypoints.openai.tool_parsers.pythonic_tool_parser import PythonicToolParser

TOOL_PARSERS: Dict[str, Type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "pythonic": PythonicToolParser,
}

__all__ = ["TOOL_PARSERS", "ExtractedToolCalls", "ToolParser"]
