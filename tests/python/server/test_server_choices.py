"""Requests with several choices (n > 1, batches of prompts) on a real `pagedkv serve`:
/metrics counts each HTTP request once, and a client that goes away aborts every one of its
sequences, streamed or not. Also the `n` limit's configuration (no server needed)."""

from __future__ import annotations

import json
import time

import pytest
from support.deps import need

httpx = need("httpx")

from pagedkv.entrypoints.openai import limits  # noqa: E402
from support.server import RemoteServer, small_server  # noqa: E402

MODEL = "smol"
SUCCESS = "pagedkv:request_success_total"
E2E = "pagedkv:e2e_request_latency_seconds_count"
GENERATED = "pagedkv:generation_tokens_total"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    srv = small_server(
        tmp_path_factory, "server_choices", model=MODEL, kv_cache_space=0.1, max_num_seqs=16
    )
    yield srv
    srv.stop()


def post(server: RemoteServer, route: str, body: dict, **kw) -> httpx.Response:
    r = httpx.post(server.url + route, json={"model": MODEL, **body}, timeout=120, **kw)
    assert r.status_code == 200, r.text
    return r


def sse_events(server: RemoteServer, route: str, body: dict) -> list:
    with httpx.stream(
        "POST", server.url + route, json={"model": MODEL, **body, "stream": True}, timeout=120
    ) as r:
        assert r.status_code == 200
        return [
            json.loads(line[6:])
            for line in r.iter_lines()
            if line.startswith("data: ") and line != "data: [DONE]"
        ]


def chat(text: str) -> list:
    return [{"role": "user", "content": text}]


def test_success_counts_requests_not_choices(server: RemoteServer) -> None:
    server.wait_idle()
    before = (
        server.metric(SUCCESS),
        server.metric(SUCCESS, finished_reason="length"),
        server.metric(E2E),
    )
    kw = {"max_tokens": 4, "ignore_eos": True, "temperature": 1.0}
    choices = [
        post(server, "/v1/completions", {"prompt": "Hello", **kw}).json()["choices"],
        post(server, "/v1/completions", {"prompt": "Hello", "n": 2, **kw}).json()["choices"],
        post(server, "/v1/completions", {"prompt": ["Hi", "Yes"], "n": 2, **kw}).json()["choices"],
        post(server, "/v1/chat/completions", {"messages": chat("Hi"), **kw}).json()["choices"],
        post(server, "/v1/chat/completions", {"messages": chat("Hi"), "n": 3, **kw}).json()[
            "choices"
        ],
    ]
    streamed = [
        sse_events(server, "/v1/completions", {"prompt": "Hello", "n": 2, **kw}),
        sse_events(server, "/v1/chat/completions", {"messages": chat("Hi"), "n": 2, **kw}),
    ]
    assert [len(c) for c in choices] == [1, 2, 4, 1, 3]  # 11 choices in 5 requests
    assert all(c["finish_reason"] == "length" for cs in choices for c in cs)
    for events in streamed:
        reasons = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
        assert reasons == ["length", "length"]
    after = (
        server.metric(SUCCESS),
        server.metric(SUCCESS, finished_reason="length"),
        server.metric(E2E),
    )
    assert [a - b for a, b in zip(after, before)] == [7, 7, 7]


def test_success_label_is_the_first_choices_reason(server: RemoteServer) -> None:
    # Two greedy prompts, and a stop string only the first one's continuation contains: in a
    # batch the first-listed prompt's choice decides the label.
    a, b = "1, 2, 3, 4, 5,", "The capital of France is"
    kw = {"max_tokens": 8, "ignore_eos": True, "temperature": 0}
    text_a = post(server, "/v1/completions", {"prompt": a, **kw}).json()["choices"][0]["text"]
    text_b = post(server, "/v1/completions", {"prompt": b, **kw}).json()["choices"][0]["text"]
    stop = next((w for w in text_a.split() if w not in text_b), None)
    assert stop is not None, (text_a, text_b)
    server.wait_idle()
    before = {r: server.metric(SUCCESS, finished_reason=r) for r in ("stop", "length")}
    out = post(server, "/v1/completions", {"prompt": [a, b], "stop": [stop], **kw}).json()
    assert [c["finish_reason"] for c in out["choices"]] == ["stop", "length"]
    events = sse_events(server, "/v1/completions", {"prompt": [b, a], "stop": [stop], **kw})
    finished = {
        c["index"]: c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]
    }
    assert finished == {0: "length", 1: "stop"}
    after = {r: server.metric(SUCCESS, finished_reason=r) for r in ("stop", "length")}
    assert {r: after[r] - before[r] for r in after} == {"stop": 1, "length": 1}


N, MAX_TOKENS = 16, 200  # 3200 tokens: many seconds on CPU, so a leak could not hide


def check_aborted(server: RemoteServer, generated_before: float, successes_before: float) -> None:
    m = server.wait_idle()
    assert m["pagedkv:num_requests_running"] == 0 and m["pagedkv:num_requests_waiting"] == 0
    assert m["pagedkv:kv_cache_usage_perc"] == 0
    generated = m[GENERATED] - generated_before
    # Every choice that ran on after its client left would have generated all of MAX_TOKENS.
    assert generated < N * MAX_TOKENS // 2, f"{generated} tokens: choices ran on after abort"
    assert server.metric(SUCCESS) == successes_before  # an aborted request is no success


@pytest.mark.parametrize(
    "route, body",
    [
        ("/v1/completions", {"prompt": "Once upon a time"}),
        ("/v1/chat/completions", {"messages": chat("Tell me a long story.")}),
    ],
)
def test_disconnect_mid_stream_aborts_every_choice(
    server: RemoteServer, route: str, body: dict
) -> None:
    server.wait_idle()
    generated, successes = server.metric(GENERATED), server.metric(SUCCESS)
    full = {
        "model": MODEL,
        **body,
        "n": N,
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "temperature": 1.0,
        "stream": True,
    }
    seen = set()
    with httpx.stream("POST", server.url + route, json=full, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen.update(c["index"] for c in json.loads(line[6:])["choices"])
            if len(seen) == N:
                break  # every choice has started; leaving the block closes the connection
    check_aborted(server, generated, successes)


def test_disconnect_before_the_response_aborts_every_choice(server: RemoteServer) -> None:
    server.wait_idle()
    generated, successes = server.metric(GENERATED), server.metric(SUCCESS)
    body = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "n": N,
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "temperature": 1.0,
    }
    start = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(server.url + "/v1/completions", json=body, timeout=1.5)
    assert time.monotonic() - start < 10
    check_aborted(server, generated, successes)


def test_zz_no_kv_block_left(server: RemoteServer) -> None:
    m = server.wait_idle()
    assert m["pagedkv:num_requests_running"] == 0 and m["pagedkv:kv_cache_usage_perc"] == 0
    assert m["pagedkv:engine_dead"] == 0
    assert "Traceback" not in server.log(), server.log()


def test_max_n_sequences_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    class Args:
        max_n_sequences = None

    monkeypatch.delenv(limits.MAX_N_ENV, raising=False)
    assert limits.max_n_sequences() == limits.DEFAULT_MAX_N_SEQUENCES == 16384
    monkeypatch.setenv(limits.MAX_N_ENV, "32")
    assert limits.max_n_sequences(Args()) == 32
    Args.max_n_sequences = 5  # an explicit setting wins over the environment
    assert limits.max_n_sequences(Args()) == 5
    for bad in ("0", "-3", "lots"):
        monkeypatch.setenv(limits.MAX_N_ENV, bad)
        with pytest.raises(ValueError, match=limits.MAX_N_ENV):
            limits.max_n_sequences()
