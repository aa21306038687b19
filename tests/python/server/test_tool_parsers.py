"""Each tool-call parser on canned model texts: the calls and the remaining content, texts that
are not calls left as content, and where a partially streamed text's tool calls begin (content
before it may be streamed; from it on, the server holds the text back)."""

from __future__ import annotations

import json

import pytest
from pagedkv.entrypoints.openai.tool_parsers import TOOL_PARSERS


def _calls(name: str, text: str) -> tuple:
    out = TOOL_PARSERS[name]().extract(text)
    return out.content, [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in out.calls
    ]


CASES = [
    (
        "hermes",
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call>\n<tool_call>{"name": "get_time", "arguments": '
        "{}}</tool_call>",
        "Let me check.\n",
        [("get_weather", {"city": "Paris"}), ("get_time", {})],
    ),
    (
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Oslo", "days": 2}}',
        None,
        [("get_weather", {"city": "Oslo", "days": 2})],
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": [1, 2]}}',
        None,
        [("a", {}), ("b", {"x": [1, 2]})],
    ),
    (
        "mistral",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Lima"}}]',
        None,
        [("get_weather", {"city": "Lima"})],
    ),
    (
        "mistral",
        'Sure.[TOOL_CALLS]get_time[ARGS]{"zone": "UTC"}',
        "Sure.",
        [("get_time", {"zone": "UTC"})],
    ),
    (
        "pythonic",
        '[get_weather(city="Paris", days=3), get_time()]',
        None,
        [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})],
    ),
]


@pytest.mark.parametrize("name, text, content, calls", CASES)
def test_parser_extracts_calls(name: str, text: str, content, calls) -> None:
    assert _calls(name, text) == (content, calls)


@pytest.mark.parametrize(
    "name, text",
    [
        ("hermes", "The weather is nice."),
        ("hermes", "<tool_call>{not json</tool_call>"),
        ("llama3_json", "I think {braces} are fine here."),
        ("mistral", "No tools needed."),
        ("pythonic", "[1, 2, 3] is a list"),
        ("pythonic", "[os.system('rm -rf /')]"),
    ],
)
def test_text_without_valid_calls_is_content(name: str, text: str) -> None:
    assert _calls(name, text) == (text, [])


@pytest.mark.parametrize(
    "name, text, start",
    [
        ("hermes", "Let me check", None),
        ("hermes", "Let me check <tool", 13),  # a marker may be starting: held back
        ("hermes", 'Ok <tool_call>{"name": "a"', 3),
        ("llama3_json", '{"name": "get_', 0),
        ("llama3_json", "Hello", None),
        ("mistral", "Sure.[TOOL_CA", 5),
        ("pythonic", "[get_weather(city=", 0),
        ("pythonic", "The answer", None),
    ],
)
def test_partial_streamed_text(name: str, text: str, start) -> None:
    assert TOOL_PARSERS[name]().calls_start(text) == start
