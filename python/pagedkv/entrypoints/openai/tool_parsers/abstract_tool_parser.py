"""What every tool-call parser does: find the tool calls in a model's text (the rest is the
answer's content), and say where, in a text still being streamed, the tool calls begin."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class ExtractedToolCalls:
    content: Optional[str]  # the text that is not a tool call (None: nothing else)
    calls: List[Dict[str, Any]] = field(default_factory=list)  # OpenAI tool_calls entries


def tool_call(name: str, arguments: Any) -> Dict[str, Any]:
    """One OpenAI tool call; ``arguments`` as the model wrote them (a dict becomes JSON)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {
        "id": "chatcmpl-tool-" + secrets.token_hex(16),
        "type": "function",
        "function": {"name": name, "arguments": args},
    }


class ToolParser:
    """Subclasses set ``markers`` (texts that open the tool-call section) and implement
    ``extract``. A text without a complete, parseable call is all content."""

    markers: tuple = ()

    def extract(self, text: str) -> ExtractedToolCalls:
        raise NotImplementedError

    def calls_start(self, text: str) -> Optional[int]:
        """Where the tool-call section begins in ``text``, or where a marker may be starting
        at its end (a streamed text must hold that back); None: all of it is content."""
        found = [i for i in (text.find(m) for m in self.markers) if i >= 0]
        if found:
            return min(found)
        for m in self.markers:
            for k in range(min(len(m) - 1, len(text)), 0, -1):
                if text.endswith(m[:k]):
                    return len(text) - k
        return None


def json_objects(text: str) -> List[Any]:
    """The JSON values written one after the other in ``text`` (separated by whitespace, ';'
    or ','); raises ValueError when something else is there."""
    decoder = json.JSONDecoder()
    out: List[Any] = []
    i = 0
    while True:
        while i < len(text) and text[i] in " \t\r\n;,":
            i += 1
        if i >= len(text):
            return out
        value, i = decoder.raw_decode(text, i)
        out.append(value)
