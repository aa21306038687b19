"""Request fields of the OpenAI / vLLM API that change the output are applied (logit_bias,
include_stop_str_in_output, prompt_logprobs, add_special_tokens) or refused with a 400 naming
them (cache_salt, functions, ...), never silently ignored; chat checks as vLLM's
(top_logprobs without logprobs, stream_options without stream, stop_reason in the streamed
finish chunk); priority outside int32 is a 400; long prompts are tokenized off the event loop
and the hopeless ones rejected by their length first. A real `pagedkv serve` subprocess on the
default model; greedy generation of a few tokens only."""

from __future__ import annotations

import json
import time
from typing import Any, Dict, List

import pytest
from support.deps import need

httpx = need("httpx")

from support.server import RemoteServer, small_server  # noqa: E402

MODEL = "smol"
MAX_MODEL_LEN = 256
PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    srv = small_server(tmp_path_factory, "server_params", model=MODEL, max_model_len=MAX_MODEL_LEN)
    yield srv
    srv.stop()


def post(
    server: RemoteServer, route: str, body: Dict[str, Any], timeout: float = 60
) -> httpx.Response:
    return httpx.post(
        server.url + route,
        content=json.dumps({"model": MODEL, **body}),
        headers={"Content-Type": "application/json"},
        timeout=timeout,
    )


def ok(r: httpx.Response) -> Dict[str, Any]:
    assert r.status_code == 200, r.text
    return r.json()


def check_400(r: httpx.Response, param: str) -> str:
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    return str(err["message"])


def complete(server: RemoteServer, **kw: Any) -> Dict[str, Any]:
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, **kw}
    return ok(post(server, "/v1/completions", body))["choices"][0]


def chat(server: RemoteServer, **kw: Any) -> Dict[str, Any]:
    body = {"messages": MESSAGES, "max_tokens": 4, "temperature": 0, **kw}
    return ok(post(server, "/v1/chat/completions", body))


def token_id(server: RemoteServer, text: str) -> int:
    ids = ok(post(server, "/tokenize", {"prompt": text, "add_special_tokens": False}))["tokens"]
    assert len(ids) == 1, (text, ids)
    return int(ids[0])


def sse(server: RemoteServer, route: str, body: Dict[str, Any]) -> List[Dict[str, Any]]:
    chunks = []
    with httpx.stream(
        "POST", server.url + route, json={"model": MODEL, "stream": True, **body}, timeout=60
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: ") :]))
    return chunks


# ---------------------------------------------------------------- logit_bias


def test_completion_logit_bias_changes_greedy_output(server: RemoteServer) -> None:
    base = complete(server, logprobs=0)
    first = token_id(server, base["logprobs"]["tokens"][0])
    banned = complete(server, logprobs=0, logit_bias={str(first): -100})
    assert banned["logprobs"]["tokens"][0] != base["logprobs"]["tokens"][0], (base, banned)
    assert banned["text"] != base["text"]
    forced_id = token_id(server, " banana")
    forced = complete(server, logit_bias={str(forced_id): 100})
    assert forced["text"] == " banana" * 4, forced
    # Values beyond OpenAI's [-100, 100] are clamped, not refused.
    assert complete(server, logit_bias={str(forced_id): 1e6})["text"] == forced["text"]
    # Sampled (not greedy) rows take the bias as well.
    assert (
        complete(server, temperature=1.0, seed=3, logit_bias={str(forced_id): 100})["text"]
        == forced["text"]
    )


def test_chat_logit_bias_changes_greedy_output(server: RemoteServer) -> None:
    base = chat(server, logprobs=True)["choices"][0]
    first_text = base["logprobs"]["content"][0]["token"]
    first = token_id(server, first_text)
    banned = chat(server, logprobs=True, logit_bias={str(first): -100})["choices"][0]
    assert banned["logprobs"]["content"][0]["token"] != first_text, (base, banned)
    forced_id = token_id(server, " banana")
    forced = chat(server, logit_bias={str(forced_id): 100})["choices"][0]
    assert forced["message"]["content"] == " banana" * 4, forced


@pytest.mark.parametrize(
    "route, body",
    [
        ("/v1/completions", {"prompt": PROMPT}),
        ("/v1/chat/completions", {"messages": MESSAGES}),
    ],
)
@pytest.mark.parametrize(
    "bias, words",
    [
        ({"49152": 5}, "out-of-vocab"),
        ({"-1": 5}, "out-of-vocab"),
        ({"abc": 5}, "integers"),
        ({"1.5": 5}, "integers"),
        ({"12": "high"}, "12"),  # pydantic's type errors name the entry: logit_bias.12
        ({"12": float("nan")}, "12"),
    ],
)
def test_bad_logit_bias_400(
    server: RemoteServer, route: str, body: dict, bias: dict, words: str
) -> None:
    r = post(server, route, {**body, "max_tokens": 2, "logit_bias": bias})
    param = "logit_bias.12" if words == "12" else "logit_bias"
    assert words in check_400(r, param)


# ---------------------------------------------------------------- include_stop_str_in_output


def test_include_stop_str_in_output(server: RemoteServer) -> None:
    text = complete(server, max_tokens=12)["text"]
    stop = text.split()[2]  # a word the greedy answer reaches after a few tokens
    cut = complete(server, max_tokens=12, stop=[stop])
    kept = complete(server, max_tokens=12, stop=[stop], include_stop_str_in_output=True)
    assert cut["stop_reason"] == kept["stop_reason"] == stop
    assert kept["text"] == cut["text"] + stop and not cut["text"].endswith(stop)
    streamed = sse(
        server,
        "/v1/completions",
        {
            "prompt": PROMPT,
            "max_tokens": 12,
            "temperature": 0,
            "stop": [stop],
            "include_stop_str_in_output": True,
        },
    )
    assert "".join(c["choices"][0]["text"] for c in streamed) == kept["text"]

    answer = chat(server, max_tokens=12)["choices"][0]["message"]["content"]
    stop = answer.split()[1]
    cut = chat(server, max_tokens=12, stop=[stop])["choices"][0]
    kept = chat(server, max_tokens=12, stop=[stop], include_stop_str_in_output=True)["choices"][0]
    assert kept["message"]["content"] == cut["message"]["content"] + stop
    streamed = sse(
        server,
        "/v1/chat/completions",
        {
            "messages": MESSAGES,
            "max_tokens": 12,
            "temperature": 0,
            "stop": [stop],
            "include_stop_str_in_output": True,
        },
    )
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in streamed)
    assert text == kept["message"]["content"]
    # Item 12: the streamed finish chunk carries stop_reason, as the non-streamed choice does.
    last = streamed[-1]["choices"][0]
    assert last["finish_reason"] == "stop" and last["stop_reason"] == stop, last


# ---------------------------------------------------------------- prompt_logprobs


def check_prompt_logprobs(table: list, num_tokens: int, k: int) -> None:
    assert len(table) == num_tokens and table[0] is None, table
    for pos in table[1:]:
        assert 1 <= len(pos) <= k + 1, pos
        for tid, entry in pos.items():
            assert int(tid) >= 0 and set(entry) == {"logprob", "rank", "decoded_token"}, entry
            assert entry["logprob"] <= 0 and entry["rank"] >= 1
            assert isinstance(entry["decoded_token"], str)
        assert any(e["rank"] == 1 for e in pos.values())


def test_prompt_logprobs(server: RemoteServer) -> None:
    prompt_ids = ok(post(server, "/tokenize", {"prompt": PROMPT}))["tokens"]
    choice = complete(server, max_tokens=1, prompt_logprobs=2)
    check_prompt_logprobs(choice["prompt_logprobs"], len(prompt_ids), 2)
    for tid, pos in zip(prompt_ids[1:], choice["prompt_logprobs"][1:]):
        assert str(tid) in pos  # the prompt's own token is always there
    assert complete(server, max_tokens=1)["prompt_logprobs"] is None
    # echo shows `logprobs` alternatives of the prompt even when prompt_logprobs asks for more.
    echoed = complete(server, max_tokens=1, echo=True, logprobs=1, prompt_logprobs=3)
    check_prompt_logprobs(echoed["prompt_logprobs"], len(prompt_ids), 3)
    assert max(len(p) for p in echoed["prompt_logprobs"][1:]) > 2
    tops = echoed["logprobs"]["top_logprobs"]
    assert tops[0] is None and all(1 <= len(t) <= 2 for t in tops[1:]), tops
    out = chat(server, max_tokens=1, prompt_logprobs=1)
    assert out["usage"]["prompt_tokens"] == len(out["prompt_logprobs"])
    check_prompt_logprobs(out["prompt_logprobs"], out["usage"]["prompt_tokens"], 1)
    assert chat(server, max_tokens=1).get("prompt_logprobs") is None


@pytest.mark.parametrize(
    "route, body",
    [
        ("/v1/completions", {"prompt": PROMPT}),
        ("/v1/chat/completions", {"messages": MESSAGES}),
    ],
)
@pytest.mark.parametrize(
    "extra",
    [{"prompt_logprobs": 21}, {"prompt_logprobs": -1}, {"prompt_logprobs": 2, "stream": True}],
)
def test_bad_prompt_logprobs_400(server: RemoteServer, route: str, body: dict, extra: dict) -> None:
    check_400(post(server, route, {**body, "max_tokens": 1, **extra}), "prompt_logprobs")


# ---------------------------------------------------------------- refused fields


UNSUPPORTED = [
    {"cache_salt": "tenant-a"},  # use_beam_search is served now (test_server_beam_search.py)
]
CHAT_UNSUPPORTED = [
    {"functions": [{"name": "f"}]},
    {"modalities": ["text", "audio"]},
    {"audio": {"voice": "alloy", "format": "wav"}},
    {"web_search_options": {}},
]


@pytest.mark.parametrize("extra", UNSUPPORTED)
def test_completion_unsupported_400(server: RemoteServer, extra: dict) -> None:
    (param,) = extra
    message = check_400(post(server, "/v1/completions", {"prompt": PROMPT, **extra}), param)
    assert message.startswith(f"{param} is not supported")


@pytest.mark.parametrize("extra", UNSUPPORTED + CHAT_UNSUPPORTED)
def test_chat_unsupported_400(server: RemoteServer, extra: dict) -> None:
    (param,) = extra
    message = check_400(
        post(server, "/v1/chat/completions", {"messages": MESSAGES, **extra}), param
    )
    assert message.startswith(f"{param} is not supported")


def test_harmless_values_of_unsupported_fields_pass(server: RemoteServer) -> None:
    base = {"max_tokens": 2, "temperature": 0}
    ok(
        post(
            server,
            "/v1/completions",
            {
                "prompt": PROMPT,
                **base,
                "response_format": {"type": "text"},
                "use_beam_search": False,
            },
        )
    )
    ok(
        post(
            server,
            "/v1/chat/completions",
            {
                "messages": MESSAGES,
                **base,
                "tools": [],
                "tool_choice": "none",
                "response_format": None,
                "echo": False,
                "modalities": ["text"],
            },
        )
    )


def test_chat_template_kwargs_chat_template_needs_trust(server: RemoteServer) -> None:
    r = post(
        server,
        "/v1/chat/completions",
        {
            "messages": MESSAGES,
            "chat_template_kwargs": {"chat_template": "{{ messages[0]['content'] }}"},
        },
    )
    assert "--trust-request-chat-template" in check_400(r, "chat_template")


def test_add_special_tokens(server: RemoteServer) -> None:
    # SmolLM2 adds no BOS to a plain prompt, so compare token counts against /tokenize's.
    for flag in (True, False):
        want = ok(post(server, "/tokenize", {"prompt": PROMPT, "add_special_tokens": flag}))
        out = ok(
            post(
                server,
                "/v1/completions",
                {"prompt": PROMPT, "max_tokens": 1, "add_special_tokens": flag},
            )
        )
        assert out["usage"]["prompt_tokens"] == want["count"]
    plain = chat(server, max_tokens=1)["usage"]["prompt_tokens"]
    assert chat(server, max_tokens=1, add_special_tokens=False)["usage"]["prompt_tokens"] == plain


# ---------------------------------------------------------------- chat checks (item 12)


def test_top_logprobs_needs_logprobs(server: RemoteServer) -> None:
    r = post(server, "/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": 2})
    assert "`logprobs` must be set to true" in check_400(r, "top_logprobs")
    r = post(
        server, "/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": 2, "logprobs": False}
    )
    check_400(r, "top_logprobs")
    # 0 asks for no alternatives: vLLM lets it through without logprobs.
    assert chat(server, max_tokens=1, top_logprobs=0)["choices"][0]["logprobs"] is None
    out = chat(server, max_tokens=1, top_logprobs=2, logprobs=True)["choices"][0]
    assert len(out["logprobs"]["content"][0]["top_logprobs"]) == 2


@pytest.mark.parametrize(
    "route, body",
    [
        ("/v1/completions", {"prompt": PROMPT}),
        ("/v1/chat/completions", {"messages": MESSAGES}),
    ],
)
def test_stream_options_need_stream(server: RemoteServer, route: str, body: dict) -> None:
    for stream in (False, None):
        extra = {"stream_options": {"include_usage": True}, "max_tokens": 1}
        if stream is not None:
            extra["stream"] = stream
        message = check_400(post(server, route, {**body, **extra}), "stream_options")
        assert "stream=True" in message
    # vLLM lets an empty object through, and null is no options at all.
    ok(post(server, route, {**body, "max_tokens": 1, "stream_options": {}}))
    ok(post(server, route, {**body, "max_tokens": 1, "stream_options": None}))


# ---------------------------------------------------------------- priority (item 8)


@pytest.mark.parametrize(
    "route, body",
    [
        ("/v1/completions", {"prompt": PROMPT}),
        ("/v1/chat/completions", {"messages": MESSAGES}),
    ],
)
@pytest.mark.parametrize("priority", [2**31, -(2**31) - 1, 2**70])
def test_priority_out_of_int32_400(
    server: RemoteServer, route: str, body: dict, priority: int
) -> None:
    check_400(post(server, route, {**body, "max_tokens": 1, "priority": priority}), "priority")


# ---------------------------------------------------------------- long prompts (item 5)


def test_hopeless_prompt_rejected_before_tokenizing(server: RemoteServer) -> None:
    huge = "hello world, " * 2_300_000  # 30 MB: over --max-request-body-size (16 MiB)
    r = post(server, "/v1/completions", {"prompt": huge, "max_tokens": 1})
    assert r.status_code == 413 and "--max-request-body-size" in r.text, r.text
    big = "hello world, " * 600_000  # 7.8 MB: ~5 s to tokenize on one core
    start = time.monotonic()
    message = check_400(post(server, "/v1/completions", {"prompt": big, "max_tokens": 1}), "prompt")
    assert "characters long" in message
    r = post(
        server,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": big}], "max_tokens": 1},
    )
    check_400(r, "messages")
    assert time.monotonic() - start < 15.0  # both; tokenizing both would take longer
    # A prompt under the bound still gets the token-count 400 it deserves.
    check_400(
        post(server, "/v1/completions", {"prompt": "hello " * (MAX_MODEL_LEN + 10)}), "prompt"
    )


def test_tokenize_is_bounded_like_prompts(server: RemoteServer) -> None:
    """Before, /tokenize counted any text (a 24 MB body grew the server by 2.3 GB); now a text
    that could not fit the context is refused by its length, before it is tokenized, while
    /health stays responsive."""
    text = "hello world, " * 450_000  # 5.8 MB
    start = time.monotonic()
    message = check_400(post(server, "/tokenize", {"prompt": text}, timeout=120), "prompt")
    assert "characters long" in message and time.monotonic() - start < 10.0
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    r = post(server, "/tokenize", {"prompt": "hello world, " * 20})
    assert r.status_code == 200 and r.json()["count"] >= 40, r.text


def test_request_chat_template_needs_trust(server: RemoteServer) -> None:
    """vLLM's --trust-request-chat-template (off here): a template is code the server runs,
    and two nested loops in one would keep it busy for hours."""
    hog = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    for route, body in (
        ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1}),
        ("/tokenize", {"messages": MESSAGES}),
    ):
        r = post(server, route, {**body, "chat_template": hog}, timeout=10)
        assert "--trust-request-chat-template" in check_400(r, "chat_template")
    assert httpx.get(server.url + "/health", timeout=2).status_code == 200


def test_zz_server_alive_and_idle(server: RemoteServer) -> None:
    m = server.wait_idle()
    assert m["pagedkv:engine_dead"] == 0 and m["pagedkv:kv_cache_usage_perc"] == 0
    assert "Traceback" not in server.log(), server.log()
