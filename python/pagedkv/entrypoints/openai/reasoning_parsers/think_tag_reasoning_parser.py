"""Reasoning between ``<think>`` and ``</think>``, split from the answer's content (the
server's --reasoning-parser): ``reasoning_content`` and ``content`` of chat answers."""

from __future__ import annotations

from typing import Optional, Tuple

START, END = "<think>", "</think>"


def _partial_suffix(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` may be the start of ``tag``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ThinkTagReasoningParser:
    """``open_by_default``: the reasoning starts without <think> (DeepSeek-R1's template writes
    it into the prompt), so a text without </think> is all reasoning; otherwise (Qwen3) only a
    text that opens with <think> has reasoning, and one that never closes it is all content."""

    open_by_default = False

    def split(self, text: str, final: bool = True) -> Tuple[Optional[str], Optional[str]]:
        """(reasoning, content) of ``text``. ``final=False``: a streamed text so far, whose end
        may be a tag still arriving (held back from both)."""
        body = text
        opened = self.open_by_default
        stripped = body.lstrip()
        if stripped.startswith(START):
            body, opened = stripped[len(START) :], True
        elif not final and START.startswith(stripped):
            return None, None  # maybe the start of <think>
        if not opened:
            return None, text
        end = body.find(END)
        if end >= 0:
            return body[:end], body[end + len(END) :] or None
        if final and not self.open_by_default:
            return None, text  # Qwen3: an unclosed <think> is not reasoning
        hold = 0 if final else _partial_suffix(body, END)
        return body[: len(body) - hold], None
