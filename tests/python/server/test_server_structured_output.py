"""Structured outputs through `pagedkv serve`, with the official openai client: response_format
json_object / json_schema, vLLM's guided_* and structured_outputs fields, on completions and
chat, streamed and not. A tiny random Llama with the SmolLM2 tokenizer picks arbitrary tokens,
so only the constraint can make the answers valid; each is checked independently (jsonschema,
re, membership)."""

from __future__ import annotations

import json
import re

import pytest
from support.deps import need
from support.server import RemoteServer, small_server

need("xgrammar")
openai = need("openai")
jsonschema = need("jsonschema")

from pagedkv.entrypoints.openai.errors import APIError  # noqa: E402
from pagedkv.entrypoints.openai.protocol import ChatCompletionRequest  # noqa: E402
from pagedkv.entrypoints.openai.tool_calls import tool_choice_of  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

MODEL = "tiny"
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Oslo", "Lima"]},
        "temp": {"type": "integer", "minimum": -50, "maximum": 50},
        "rain": {"type": "boolean"},
    },
    "required": ["city", "temp", "rain"],
}
MESSAGES = [{"role": "user", "content": "Weather report as JSON please."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    model_dir = save_random_model(
        str(tmp_path_factory.mktemp("so_model")),
        "tiny-llama",
        seed=5,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=1024,
    )
    srv = small_server(
        tmp_path_factory,
        "server_structured",
        model=MODEL,
        max_num_seqs=16,
        max_model_len=1024,
        extra_args=[
            "--model",
            model_dir,
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            "--reasoning-parser",
            "qwen3",
        ],
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: RemoteServer):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def _schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "w", "schema": schema, "strict": True}}


def test_chat_json_schema_n4_validates(client) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        n=4,
        max_tokens=200,
        temperature=1.0,
        seed=3,
        response_format=_schema_format(SCHEMA),
        extra_body={"structured_outputs": None},
    )
    assert len(r.choices) == 4
    for c in r.choices:
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content), SCHEMA)


def test_completion_guided_fields(client) -> None:
    pattern = r"[A-Z]{2}-[0-9]{2,4}"
    r = client.completions.create(
        model=MODEL,
        prompt="Code:",
        max_tokens=20,
        n=3,
        seed=1,
        extra_body={"guided_regex": pattern},
    )
    assert all(re.fullmatch(pattern, c.text) for c in r.choices), [c.text for c in r.choices]
    choices = ["left", "right", "up down"]
    r = client.completions.create(
        model=MODEL, prompt="Go:", max_tokens=20, n=3, seed=2, extra_body={"guided_choice": choices}
    )
    assert all(c.text in choices for c in r.choices)
    r = client.completions.create(
        model=MODEL, prompt="Obj:", max_tokens=200, seed=2, extra_body={"guided_json": SCHEMA}
    )
    jsonschema.validate(json.loads(r.choices[0].text), SCHEMA)
    r = client.completions.create(
        model=MODEL,
        prompt="Sum:",
        max_tokens=20,
        seed=4,
        extra_body={"structured_outputs": {"grammar": 'root ::= [1-9] ("+" [1-9])*'}},
    )
    assert re.fullmatch(r"[1-9](\+[1-9])*", r.choices[0].text)


def test_streamed_chat_json_schema(client) -> None:
    chunks = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=200,
        seed=9,
        stream=True,
        response_format=_schema_format(SCHEMA),
    )
    text, finish = "", None
    for ch in chunks:
        for c in ch.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert finish == "stop"
    jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object(client) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=40,
        seed=5,
        response_format={"type": "json_object"},
    )
    c = r.choices[0]
    assert c.message.content.lstrip().startswith("{")
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.message.content), dict)


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"guided_regex": "(unclosed"}, "structured_outputs"),
        ({"guided_json": {"type": "object"}, "guided_regex": "a"}, "guided_regex"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs"),
        ({"structured_outputs": {"colour": "red"}}, "structured_outputs"),
    ],
)
def test_bad_constraints_are_400(client, extra: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="x", max_tokens=4, extra_body=extra)
    assert param in str(err.value)


# ---------------------------------------------------------------- tools

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {"name": "get_time", "description": "Clock.", "parameters": TIME},
    },
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}


def _check_calls(calls) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_named_tool_choice(client) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=TOOLS,
        max_tokens=200,
        seed=1,
        n=2,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    for c in r.choices:
        assert c.finish_reason == "stop" and c.message.content is None
        assert [t.function.name for t in c.message.tool_calls] == ["get_time"]
        _check_calls(c.message.tool_calls)


def test_required_tool_choice(client) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=TOOLS,
        n=3,
        max_tokens=300,
        seed=2,
        tool_choice="required",
    )
    for c in r.choices:
        assert c.finish_reason == "tool_calls"
        _check_calls(c.message.tool_calls)


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_streamed_tool_calls(client, choice) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=TOOLS,
        max_tokens=700,
        seed=4,
        tool_choice=choice,
        stream=True,
    )
    calls: dict = {}
    finish = None
    for ch in stream:
        for c in ch.choices:
            finish = c.finish_reason or finish
            for t in c.delta.tool_calls or []:
                if t.id:  # a call opens with its id, type and name
                    assert t.index not in calls and t.type == "function"
                    calls[t.index] = {"id": t.id, "name": t.function.name, "arguments": ""}
                calls[t.index]["arguments"] += t.function.arguments or ""
    assert finish == ("tool_calls" if choice == "required" else "stop")
    assert calls
    for call in calls.values():
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


def test_tool_choice_none_and_history(client) -> None:
    history = MESSAGES + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]
    r = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, tool_choice="none", max_tokens=5, temperature=0
    )
    c = r.choices[0]
    assert isinstance(c.message.content, str) and not c.message.tool_calls
    assert c.finish_reason == "length"


@pytest.mark.parametrize(
    "extra",
    [
        {"tool_choice": "required"},
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        {"tools": [{"type": "function", "function": {}}], "tool_choice": "required"},
    ],
)
def test_bad_tool_requests_are_400(client, extra: dict) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=4, extra_body=extra
        )
    assert "tool" in str(err.value)


# A hermes tool call the random model must write (the regex forces it); the server's hermes
# parser (--tool-call-parser hermes) must find it, streamed or not.
HERMES = (
    r'Checking\. <tool_call>\{"name": "get_time", "arguments": \{"zone": "(UTC|CET)"\}\}'
    r"</tool_call>"
)


def test_auto_tool_choice_with_parser(client) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=TOOLS,
        max_tokens=100,
        seed=1,
        extra_body={"guided_regex": HERMES},
    )
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content == "Checking. "
    _check_calls(c.message.tool_calls)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="auto",
        max_tokens=100,
        seed=1,
        stream=True,
        extra_body={"guided_regex": HERMES},
    )
    content, calls, finish = "", [], None
    for ch in stream:
        for ci in ch.choices:
            content += ci.delta.content or ""
            calls += ci.delta.tool_calls or []
            finish = ci.finish_reason or finish
    assert (content, finish) == ("Checking. ", "tool_calls")
    assert [t.function.name for t in calls] == ["get_time"]
    jsonschema.validate(json.loads(calls[0].function.arguments), TIME)
    plain = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=8, temperature=0
    )
    assert plain.choices[0].message.content and not plain.choices[0].message.tool_calls


def test_auto_needs_the_server_flags() -> None:
    req = ChatCompletionRequest(messages=MESSAGES, tools=TOOLS)
    with pytest.raises(APIError, match="--enable-auto-tool-choice"):
        tool_choice_of(req, None)
    assert tool_choice_of(req, "hermes").mode == "auto"


THINK = r"<think>[a-z]{1,8}( [a-z]{1,8}){0,3}</think>Answer: (yes|no)"


def test_reasoning_parser_splits_reasoning(client) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=80, seed=2, extra_body={"guided_regex": THINK}
    )
    msg = r.choices[0].message.model_dump()
    assert re.fullmatch(r"[a-z]{1,8}( [a-z]{1,8}){0,3}", msg["reasoning_content"])
    assert msg["content"] in ("Answer: yes", "Answer: no")
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=80,
        seed=2,
        stream=True,
        extra_body={"guided_regex": THINK},
    )
    thought, content = "", ""
    for ch in stream:
        for c in ch.choices:
            delta = c.delta.model_dump()
            thought += delta.get("reasoning_content") or ""
            content += delta.get("content") or ""
    assert (thought, content) == (msg["reasoning_content"], msg["content"])
