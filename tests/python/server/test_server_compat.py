"""What a client written for vLLM's OpenAI server relies on, on a real `pagedkv serve`: the
response id taken from X-Request-Id or the body's request_id (and the header echoed with
--enable-request-id-headers); echo with max_tokens 0 (prompt scoring); null meaning "default"
for the fields vLLM declares Optional; stream_options' include_usage defaulting to true; the
chat fields best_of, reasoning_effort, parallel_tool_calls and verbosity handled as vLLM does;
CORS; --response-role, --scheduling-policy and --max-logprobs. Greedy generation of a few
tokens only."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Dict, List

import pytest
from support.deps import need

httpx = need("httpx")

from support.server import RemoteServer, small_server  # noqa: E402

MODEL = "smol"
PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    srv = small_server(
        tmp_path_factory,
        "server_compat",
        model=MODEL,
        extra_args=[
            "--enable-request-id-headers",
            "--response-role",
            "bot",
            "--scheduling-policy",
            "priority",
            "--max-logprobs",
            "30",
            "--trust-request-chat-template",
        ],
    )
    yield srv
    srv.stop()


def post(
    server: RemoteServer, route: str, body: Dict[str, Any], headers: Dict[str, str] | None = None
) -> httpx.Response:
    return httpx.post(
        server.url + route, json={"model": MODEL, **body}, headers=headers, timeout=60
    )


def ok(r: httpx.Response) -> Dict[str, Any]:
    assert r.status_code == 200, r.text
    return r.json()


def sse(
    server: RemoteServer, route: str, body: Dict[str, Any], headers: Dict[str, str] | None = None
) -> List[Dict[str, Any]]:
    chunks = []
    with httpx.stream(
        "POST",
        server.url + route,
        json={"model": MODEL, "stream": True, **body},
        headers=headers,
        timeout=60,
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: ") :]))
    return chunks


def complete_body(**kw: Any) -> Dict[str, Any]:
    return {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, **kw}


def chat_body(**kw: Any) -> Dict[str, Any]:
    return {"messages": MESSAGES, "max_tokens": 3, "temperature": 0, **kw}


def test_response_id_from_header_or_request_id(server: RemoteServer) -> None:
    r = post(server, "/v1/completions", complete_body(), {"X-Request-Id": "abc123"})
    assert ok(r)["id"] == "cmpl-abc123" and r.headers["x-request-id"] == "abc123"
    r = post(server, "/v1/chat/completions", chat_body(request_id="my-id"))
    assert ok(r)["id"] == "chatcmpl-my-id"
    assert r.headers["x-request-id"] == "chatcmpl-my-id"  # no header sent: the request's id
    # The header wins over the field, as in vLLM; streamed chunks carry the same id.
    chunks = sse(
        server, "/v1/chat/completions", chat_body(request_id="field"), {"X-Request-Id": "hdr"}
    )
    assert {c["id"] for c in chunks} == {"chatcmpl-hdr"}
    plain = ok(post(server, "/v1/completions", complete_body()))["id"]
    assert plain.startswith("cmpl-") and len(plain) > len("cmpl-") + 16


def test_one_client_id_on_concurrent_requests(server: RemoteServer) -> None:
    """A client id is not unique (a fixed id, retries): every request still runs."""

    async def go() -> List[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as c:
            return await asyncio.gather(
                *[
                    c.post(
                        server.url + "/v1/completions",
                        json=complete_body(max_tokens=8),
                        headers={"X-Request-Id": "same"},
                    )
                    for _ in range(4)
                ]
            )

    for r in asyncio.run(go()):
        assert ok(r)["id"] == "cmpl-same"


def test_echo_with_max_tokens_zero_returns_the_prompt_alone(server: RemoteServer) -> None:
    body = complete_body(prompt="Hello world", max_tokens=0, echo=True, logprobs=1)
    choice = ok(post(server, "/v1/completions", body))["choices"][0]
    assert choice["text"] == "Hello world"
    lps = choice["logprobs"]
    assert "".join(lps["tokens"]) == "Hello world" and lps["text_offset"][0] == 0
    assert lps["token_logprobs"][0] is None and all(v < 0 for v in lps["token_logprobs"][1:])
    chunks = sse(server, "/v1/completions", body)
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Hello world"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    # Without echo, 0 is still refused.
    r = post(server, "/v1/completions", complete_body(max_tokens=0))
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_null_is_the_default_for_vllms_optional_fields(server: RemoteServer) -> None:
    ok(post(server, "/v1/completions", complete_body(stream=None, echo=None, n=None)))
    out = ok(
        post(
            server,
            "/v1/chat/completions",
            chat_body(
                stream=None,
                logprobs=None,
                top_logprobs=None,
                parallel_tool_calls=None,
                reasoning_effort=None,
            ),
        )
    )
    assert out["choices"][0]["logprobs"] is None
    chunks = sse(server, "/v1/completions", complete_body(stream_options={"include_usage": None}))
    assert all("usage" not in c for c in chunks)


def test_stream_options_include_usage_defaults_to_true(server: RemoteServer) -> None:
    chunks = sse(server, "/v1/completions", complete_body(stream_options={}))
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    chunks = sse(
        server, "/v1/chat/completions", chat_body(stream_options={"continuous_usage_stats": True})
    )
    assert all(c.get("usage") for c in chunks), chunks
    prompt_tokens = chunks[-1]["usage"]["prompt_tokens"]
    # The role chunk too, with the prompt's usage only (as vLLM's).
    assert chunks[0]["choices"][0]["delta"]["role"] == "bot"
    assert chunks[0]["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 0,
        "total_tokens": prompt_tokens,
    }


def test_chat_best_of(server: RemoteServer) -> None:
    r = post(server, "/v1/chat/completions", chat_body(best_of=3))
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of", r.text
    ok(post(server, "/v1/chat/completions", chat_body(best_of=2, n=2)))


def test_reasoning_effort_is_checked_and_reaches_the_template(server: RemoteServer) -> None:
    r = post(server, "/v1/chat/completions", chat_body(reasoning_effort="extreme"))
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort", r.text
    template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if reasoning_effort is defined %} effort: {{ reasoning_effort }}{% endif %}"
    )
    plain = ok(post(server, "/v1/chat/completions", chat_body(chat_template=template)))
    high = ok(
        post(
            server,
            "/v1/chat/completions",
            chat_body(chat_template=template, reasoning_effort="high"),
        )
    )
    assert high["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"]
    # SmolLM2's own template does not read it: same answer as without.
    assert (
        ok(post(server, "/v1/chat/completions", chat_body(reasoning_effort="low")))["choices"][0][
            "message"
        ]["content"]
        == ok(post(server, "/v1/chat/completions", chat_body()))["choices"][0]["message"]["content"]
    )


def test_parallel_tool_calls_and_verbosity(server: RemoteServer) -> None:
    ok(post(server, "/v1/chat/completions", chat_body(parallel_tool_calls=False)))
    r = post(server, "/v1/chat/completions", chat_body(parallel_tool_calls=[1]))
    assert r.status_code == 400 and r.json()["error"]["param"] == "parallel_tool_calls"
    # vLLM has no verbosity: accepted, and logged as ignored.
    ok(post(server, "/v1/chat/completions", chat_body(verbosity="low")))
    assert "present in the request but ignored: verbosity" in server.log()


def test_priority_scheduling_policy(server: RemoteServer) -> None:
    ok(post(server, "/v1/completions", complete_body(priority=5)))


def test_cors(server: RemoteServer) -> None:
    r = httpx.options(
        server.url + "/v1/chat/completions",
        headers={
            "Origin": "http://ui.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
    )
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == "*"
    assert "POST" in r.headers["access-control-allow-methods"]
    r = httpx.get(server.url + "/v1/models", headers={"Origin": "http://ui.example"})
    assert r.headers["access-control-allow-origin"] == "*"


def test_trusted_slow_template_renders_off_the_event_loop(server: RemoteServer) -> None:
    """A template that takes seconds (trusted here) does not freeze /health meanwhile."""
    import threading
    import time

    slow = (
        "{% for i in range(100000) %}{% for j in range(1500) %}{% endfor %}{% endfor %}"
        "{{ messages[0]['content'] }}"
    )
    result: Dict[str, Any] = {}
    t = threading.Thread(
        target=lambda: result.update(
            r=post(server, "/v1/chat/completions", chat_body(chat_template=slow, max_tokens=1))
        )
    )
    t.start()
    time.sleep(0.3)
    try:
        for _ in range(4):
            assert httpx.get(server.url + "/health", timeout=1.5).status_code == 200
            time.sleep(0.2)
    finally:
        t.join(120)
    ok(result["r"])


def test_special_tokens_spelled_out_in_detokenize_echo_and_logprobs(server: RemoteServer) -> None:
    """As vLLM (HF's decode default): /detokenize, a token-id prompt's echo and logprob tokens
    keep special tokens, so the echoed text, its tokens and their text_offset agree."""
    ids = ok(
        post(
            server,
            "/tokenize",
            {"prompt": "<|im_start|>Hello<|im_end|>", "add_special_tokens": False},
        )
    )["tokens"]
    assert len(ids) == 3
    assert (
        ok(post(server, "/detokenize", {"tokens": ids}))["prompt"] == "<|im_start|>Hello<|im_end|>"
    )
    choice = ok(
        post(
            server,
            "/v1/completions",
            complete_body(prompt=ids, max_tokens=0, echo=True, logprobs=0),
        )
    )["choices"][0]
    assert choice["text"] == "<|im_start|>Hello<|im_end|>"
    lps = choice["logprobs"]
    assert "".join(lps["tokens"]) == choice["text"]
    assert lps["text_offset"] == [0, len("<|im_start|>"), len("<|im_start|>Hello")]


def test_continue_final_message_and_echo(server: RemoteServer) -> None:
    """vLLM's prefill: the answer continues the last (assistant) message, and echo starts the
    answer with it; its role is that message's."""
    start = "My favourite colour is"
    messages = [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": start},
    ]
    body = chat_body(
        messages=messages,
        add_generation_prompt=False,
        continue_final_message=True,
        echo=True,
        max_tokens=4,
    )
    msg = ok(post(server, "/v1/chat/completions", body))["choices"][0]["message"]
    assert msg["role"] == "assistant" and msg["content"].startswith(start)
    assert len(msg["content"]) > len(start)
    chunks = sse(server, "/v1/chat/completions", body)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == msg["content"]
    # Without echo the answer is the continuation alone.
    body["echo"] = False
    alone = ok(post(server, "/v1/chat/completions", body))["choices"][0]["message"]["content"]
    assert start + alone == msg["content"]
    # Not both (vLLM's check); echo of a user turn adds nothing.
    r = post(server, "/v1/chat/completions", chat_body(continue_final_message=True))
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"
    plain = ok(post(server, "/v1/chat/completions", chat_body()))["choices"][0]["message"]
    assert (
        ok(post(server, "/v1/chat/completions", chat_body(echo=True)))["choices"][0]["message"][
            "content"
        ]
        == plain["content"]
    )


def test_chat_template_kwargs_and_documents_reach_the_template(server: RemoteServer) -> None:
    ok(
        post(
            server,
            "/v1/chat/completions",
            chat_body(chat_template_kwargs={"enable_thinking": False}),
        )
    )  # Qwen3 clients send it; SmolLM2's template ignores it
    template = (
        "{{ greeting | default('') }}{% for d in documents or [] %}{{ d['text'] }}"
        "{% endfor %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )

    def count(**kw: Any) -> int:
        body = chat_body(chat_template=template, max_tokens=1, **kw)
        return ok(post(server, "/v1/chat/completions", body))["usage"]["prompt_tokens"]

    plain = count()
    assert count(chat_template_kwargs={"greeting": "Good morning to you. "}) > plain
    assert count(documents=[{"title": "t", "text": "Paris is the capital of France. "}]) > plain
    r = post(server, "/v1/chat/completions", chat_body(chat_template_kwargs={"tokenize": True}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"


def test_return_token_ids(server: RemoteServer) -> None:
    """vLLM's return_token_ids: completions choices carry prompt_token_ids and token_ids,
    chat has the prompt's at the top and token_ids per choice; streamed, the ids add up to the
    same. Without it the answer has no such keys."""
    prompt_ids = ok(post(server, "/tokenize", {"prompt": PROMPT}))["tokens"]
    choice = ok(post(server, "/v1/completions", complete_body(return_token_ids=True, logprobs=0)))[
        "choices"
    ][0]
    assert choice["prompt_token_ids"] == prompt_ids and len(choice["token_ids"]) == 3
    assert (
        ok(post(server, "/detokenize", {"tokens": choice["token_ids"]}))["prompt"] == choice["text"]
    )
    chunks = sse(server, "/v1/completions", complete_body(return_token_ids=True))
    assert chunks[0]["choices"][0]["prompt_token_ids"] == prompt_ids
    assert sum((c["choices"][0]["token_ids"] for c in chunks), []) == choice["token_ids"]
    out = ok(post(server, "/v1/chat/completions", chat_body(return_token_ids=True)))
    assert len(out["prompt_token_ids"]) == out["usage"]["prompt_tokens"]
    assert len(out["choices"][0]["token_ids"]) == out["usage"]["completion_tokens"]
    chunks = sse(server, "/v1/chat/completions", chat_body(return_token_ids=True))
    assert chunks[0]["prompt_token_ids"] == out["prompt_token_ids"]
    assert (
        sum((c["choices"][0].get("token_ids", []) for c in chunks), [])
        == out["choices"][0]["token_ids"]
    )
    plain = ok(post(server, "/v1/completions", complete_body()))
    assert "token_ids" not in plain["choices"][0] and "prompt_token_ids" not in plain["choices"][0]


def test_return_tokens_as_token_ids(server: RemoteServer) -> None:
    choice = ok(
        post(
            server,
            "/v1/completions",
            complete_body(return_tokens_as_token_ids=True, return_token_ids=True, logprobs=2),
        )
    )["choices"][0]
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert all(k.startswith("token_id:") for top in choice["logprobs"]["top_logprobs"] for k in top)
    out = ok(
        post(
            server,
            "/v1/chat/completions",
            chat_body(
                return_tokens_as_token_ids=True,
                return_token_ids=True,
                logprobs=True,
                top_logprobs=2,
            ),
        )
    )
    content = out["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == [
        f"token_id:{t}" for t in out["choices"][0]["token_ids"]
    ]
    assert all(t["token"].startswith("token_id:") for e in content for t in e["top_logprobs"])


def test_truncate_prompt_tokens_keeps_the_last_tokens(server: RemoteServer) -> None:
    """vLLM's truncate_prompt_tokens: a prompt longer than the context runs on its last k
    tokens instead of being refused (text, token ids, chat); k above max_model_len is a 400."""
    long_text = "one two three four five six seven eight nine ten " * 60  # > 256 tokens
    r = post(server, "/v1/completions", complete_body(prompt=long_text))
    assert r.status_code == 400  # too long without truncation
    out = ok(
        post(
            server,
            "/v1/completions",
            complete_body(
                prompt=long_text, truncate_prompt_tokens=40, echo=True, return_token_ids=True
            ),
        )
    )
    choice = out["choices"][0]
    assert out["usage"]["prompt_tokens"] == 40 == len(choice["prompt_token_ids"])
    full = ok(post(server, "/tokenize", {"prompt": long_text}))["tokens"]
    assert choice["prompt_token_ids"] == full[-40:]
    kept = ok(post(server, "/detokenize", {"tokens": full[-40:]}))["prompt"]
    assert choice["text"].startswith(kept)  # echo shows what the model saw
    ids_out = ok(
        post(server, "/v1/completions", complete_body(prompt=full, truncate_prompt_tokens=40))
    )
    assert ids_out["choices"][0]["text"] == choice["text"][len(kept) :]
    chat = ok(
        post(
            server,
            "/v1/chat/completions",
            chat_body(messages=[{"role": "user", "content": long_text}], truncate_prompt_tokens=30),
        )
    )
    assert chat["usage"]["prompt_tokens"] == 30
    r = post(server, "/v1/completions", complete_body(truncate_prompt_tokens=10**6))
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"


def test_allowed_token_ids_and_bad_words(server: RemoteServer) -> None:
    """vLLM's allowed_token_ids (only these ids are sampled) and bad_words (never generated)
    reach SamplingParams on both endpoints; ids outside the vocabulary are a 400."""
    plain = ok(post(server, "/v1/completions", complete_body(max_tokens=4, return_token_ids=True)))
    first = plain["choices"][0]["token_ids"][0]
    allowed = [first + 1, first + 2]
    for route, body in (
        ("/v1/completions", complete_body(max_tokens=4)),
        ("/v1/chat/completions", chat_body(max_tokens=4)),
    ):
        out = ok(
            post(
                server,
                route,
                {
                    **body,
                    "allowed_token_ids": allowed,
                    "ignore_eos": True,
                    "return_token_ids": True,
                },
            )
        )
        ids = out["choices"][0]["token_ids"]
        assert len(ids) == 4 and set(ids) <= set(allowed), ids
    word = plain["choices"][0]["text"].split()[0]
    banned = ok(post(server, "/v1/completions", complete_body(max_tokens=4, bad_words=[word])))
    assert not banned["choices"][0]["text"].lstrip().startswith(word), (word, banned)
    r = post(server, "/v1/completions", complete_body(allowed_token_ids=[10**7]))
    assert r.status_code == 400 and "allowed_token_ids" in r.text


def test_tokenize_extensions(server: RemoteServer) -> None:
    """vLLM's /tokenize: return_token_strs, and a request chat_template for messages."""
    out = ok(post(server, "/tokenize", {"prompt": "Hello world", "return_token_strs": True}))
    assert len(out["token_strs"]) == out["count"] == 2 and out["token_strs"][0] == "Hello"
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    out = ok(
        post(
            server,
            "/tokenize",
            {"messages": [{"role": "user", "content": "Hello"}], "chat_template": template},
        )
    )
    assert out["tokens"] == ok(post(server, "/tokenize", {"prompt": "Hello"}))["tokens"]
    # The prompt a chat request with the same template settings gets (its usage counts it).
    messages = [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "My favourite colour is"},
    ]
    settings = {
        "messages": messages,
        "add_generation_prompt": False,
        "continue_final_message": True,
        "chat_template_kwargs": {"greeting": "Hi. "},
        "chat_template": "{{ greeting }}{% for m in messages %}{{ m['content'] }}{% endfor %}",
    }
    count = ok(post(server, "/tokenize", settings))["count"]
    assert (
        count
        == ok(post(server, "/v1/chat/completions", {**settings, "max_tokens": 1}))["usage"][
            "prompt_tokens"
        ]
    )
    assert (
        count
        > ok(post(server, "/tokenize", {**settings, "chat_template_kwargs": {"greeting": ""}}))[
            "count"
        ]
    )


def test_cache_salt_refused_and_user_accepted_quietly(server: RemoteServer) -> None:
    """A salt asks for a prefix cache of its own; pagedkv cannot give one, so 400 rather than
    sharing the cache it was meant to separate. `user` is a declared field: no warning."""
    r = post(server, "/v1/completions", complete_body(cache_salt="tenant-1"))
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", r.text
    ok(post(server, "/v1/completions", complete_body(user="someone-unique-42")))
    assert "ignored: user" not in server.log()


def test_logprobs_cap_is_the_servers_max_logprobs(server: RemoteServer) -> None:
    """--max-logprobs 30 (vLLM's max_logprobs) sets the cap of every logprobs field, not 20."""
    choice = ok(post(server, "/v1/completions", complete_body(max_tokens=1, logprobs=25)))
    assert len(choice["choices"][0]["logprobs"]["top_logprobs"][0]) >= 25
    out = ok(
        post(
            server, "/v1/chat/completions", chat_body(max_tokens=1, logprobs=True, top_logprobs=30)
        )
    )
    assert len(out["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 30
    ok(post(server, "/v1/completions", complete_body(max_tokens=1, prompt_logprobs=30)))
    for route, body, param in (
        ("/v1/completions", complete_body(logprobs=31), "logprobs"),
        ("/v1/completions", complete_body(prompt_logprobs=31), "prompt_logprobs"),
        ("/v1/chat/completions", chat_body(logprobs=True, top_logprobs=31), "top_logprobs"),
    ):
        r = post(server, route, body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert "[0, 30]" in r.json()["error"]["message"]


@pytest.fixture(scope="module")
def one_seq_server(tmp_path_factory: pytest.TempPathFactory):
    srv = small_server(tmp_path_factory, "server_one_seq", model=MODEL, max_num_seqs=1)
    yield srv
    srv.stop()


def test_batch_prompts_stream_while_the_next_one_waits(one_seq_server: RemoteServer) -> None:
    """A streamed batch of prompts, one sequence at a time: the first prompt's tokens stream as
    they come. The prompts' streams were read in turn, so the first one's tokens waited,
    unstreamed, for the second prompt to start (two chunks instead of sixteen)."""
    chunks = sse(
        one_seq_server,
        "/v1/completions",
        complete_body(prompt=["Once upon a time", "Hello"], max_tokens=16, ignore_eos=True),
    )
    order = [c["choices"][0]["index"] for c in chunks]
    # (a token may hold its text back for the next one's: a chunk per token at most)
    assert order.count(0) >= 8 and order.count(1) >= 8, order
    assert order.index(1) == order.count(0), order  # all of the first before the second
    assert one_seq_server.wait_idle()["pagedkv:kv_cache_usage_perc"] == 0


def test_request_length_histograms(server: RemoteServer) -> None:
    """vLLM's request_prompt_tokens / request_generation_tokens (its dashboards' length
    panels), one observation per HTTP request, streamed or not."""

    def sums() -> tuple:
        return (
            server.metric("pagedkv:request_prompt_tokens_sum"),
            server.metric("pagedkv:request_generation_tokens_sum"),
            server.metric("pagedkv:request_prompt_tokens_count"),
        )

    before = sums()
    usage = ok(post(server, "/v1/completions", complete_body(n=2)))["usage"]
    sse(server, "/v1/chat/completions", chat_body(stream_options={"include_usage": True}))
    after = sums()
    assert after[2] - before[2] == 2
    assert after[0] - before[0] > usage["prompt_tokens"]
    assert after[1] - before[1] == usage["completion_tokens"] + 3


def test_zz_server_alive_and_idle(server: RemoteServer) -> None:
    m = server.wait_idle()
    assert m["pagedkv:kv_cache_usage_perc"] == 0 and m["pagedkv:num_requests_running"] == 0


def test_metrics_series_exist_before_the_first_request() -> None:
    """As vLLM's: every latency / length histogram and the success counter's stop and length
    series are exported at zero from the start (test_metrics_move failed when run alone)."""
    from types import SimpleNamespace

    from pagedkv.entrypoints.openai.metrics import ServerMetrics

    engine = SimpleNamespace(get_stats=dict, is_dead=False)
    text = ServerMetrics(engine, "m", max_model_len=64).render().decode()
    for name in (
        "time_to_first_token_seconds",
        "time_per_output_token_seconds",
        "e2e_request_latency_seconds",
        "request_prompt_tokens",
        "request_generation_tokens",
    ):
        assert f'pagedkv:{name}_count{{model_name="m"}} 0.0' in text, name
    assert 'pagedkv:request_success_total{finished_reason="stop",model_name="m"} 0.0' in text
