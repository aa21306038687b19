"""The reasoning parsers on canned texts, whole and streamed piece by piece: the reasoning and
content of the finished text, and streamed pieces that only ever grow (no tag shown)."""

from __future__ import annotations

import pytest
from pagedkv.entrypoints.openai.reasoning_parsers import REASONING_PARSERS

CASES = [
    ("deepseek_r1", "<think>Add them.</think>The sum is 4.", "Add them.", "The sum is 4."),
    ("deepseek_r1", "Add them.</think>\n4", "Add them.", "\n4"),  # template opened <think>
    ("deepseek_r1", "Still thinking", "Still thinking", None),
    ("qwen3", "<think>\nAdd.\n</think>\n\n4", "\nAdd.\n", "\n\n4"),
    ("qwen3", "No thinking here.", None, "No thinking here."),
    ("qwen3", "<think>never closed", None, "<think>never closed"),
]


@pytest.mark.parametrize("name, text, reasoning, content", CASES)
def test_split(name: str, text: str, reasoning, content) -> None:
    assert REASONING_PARSERS[name]().split(text) == (reasoning, content)


@pytest.mark.parametrize("name, text, reasoning, content", CASES[:5])
def test_streamed_prefixes_grow_and_hide_tags(name: str, text: str, reasoning, content) -> None:
    parser = REASONING_PARSERS[name]()
    last = ("", "")
    for i in range(1, len(text) + 1):
        r, c = parser.split(text[:i], final=False)
        r, c = r or "", c or ""
        assert r.startswith(last[0]) and c.startswith(last[1]), (text[:i], r, c)
        assert "</think>" not in r + c and "<think>" not in r
        last = (r, c)
    assert last == (reasoning or "", content or "")
