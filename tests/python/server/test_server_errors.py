"""400 answers of the OpenAI server name the field they are about: `error.param` is exactly
the request field, on /v1/completions and /v1/chat/completions alike (a real `pagedkv serve`
subprocess; no generation beyond a few tokens)."""

from __future__ import annotations

import json

import pytest
from support.deps import need

httpx = need("httpx")

from support.server import RemoteServer, small_server  # noqa: E402

MODEL = "smol"
MAX_MODEL_LEN = 256
MAX_N = 64  # the server's $PAGEDKV_MAX_N_SEQUENCES here, low so that the test stays cheap


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    srv = small_server(
        tmp_path_factory,
        "server_errors",
        model=MODEL,
        max_model_len=MAX_MODEL_LEN,
        env={"PAGEDKV_MAX_N_SEQUENCES": str(MAX_N)},
    )
    yield srv
    srv.stop()


# Bad values of fields both endpoints take -> the param the 400 must name.
COMMON = [
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_k": -5}, "top_k"),
    ({"min_p": 2.0}, "min_p"),
    ({"temperature": -1.0}, "temperature"),
    ({"presence_penalty": 5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"stop": [""]}, "stop"),
    ({"stop": ["ok", ""]}, "stop"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"stop_token_ids": [2, 10**9]}, "stop_token_ids"),  # out of the vocabulary (vLLM: 400)
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 10, "max_tokens": 5}, "min_tokens"),
    ({"seed": "abc"}, "seed"),
    ({"seed": 2**70}, "seed"),
    ({"repetition_penalty": float("inf")}, "repetition_penalty"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": float("nan")}, "top_p"),
    ({"n": 0}, "n"),
    ({"n": -1}, "n"),
    ({"n": "many"}, "n"),
    ({"n": 2.5}, "n"),
    ({"n": MAX_N + 1}, "n"),
    ({"n": 100_000, "max_tokens": 1}, "n"),
    # issue #25: integers past int64 and floats past float32 never reach the sampler
    ({"top_k": 2**64}, "top_k"),
    ({"temperature": 1e39}, "temperature"),
    ({"repetition_penalty": 1e-46}, "repetition_penalty"),
    ({"prompt_logprobs": 2**64}, "prompt_logprobs"),
    ({"request_id": "a\r\nInjected: 1"}, "request_id"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -3}, "max_tokens"),
    ({"max_tokens": MAX_MODEL_LEN + 1}, "max_tokens"),
]

COMPLETION_ONLY = [
    ({"logprobs": 21}, "logprobs"),
    ({"logprobs": -1}, "logprobs"),
    ({"suffix": "tail"}, "suffix"),
    ({"best_of": 1, "n": 2}, "best_of"),  # best_of < n (best_of > n samples: beam tests)
    ({"prompt": []}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": "hello " * (MAX_MODEL_LEN + 10)}, "prompt"),
    ({"prompt": [1, 2, 10**9]}, "prompt"),
    ({"prompt": None}, "prompt"),
]

CHAT_ONLY = [
    ({"top_p": 2}, "top_p"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"max_completion_tokens": 0, "max_tokens": 5}, "max_completion_tokens"),
    ({"max_completion_tokens": -2}, "max_completion_tokens"),
    ({"max_completion_tokens": MAX_MODEL_LEN + 1}, "max_completion_tokens"),
    ({"messages": []}, "messages"),
]


def post(server: RemoteServer, route: str, body: dict) -> httpx.Response:
    # json.dumps, not httpx's json=: the body may hold NaN / Infinity, as clients can send.
    return httpx.post(
        server.url + route,
        content=json.dumps({"model": MODEL, **body}),
        headers={"Content-Type": "application/json"},
        timeout=60,
    )


def check_400(r: httpx.Response, param: str) -> dict:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["type"] == "invalid_request_error" and err["message"], err
    assert err["param"] == param, err
    return err


@pytest.mark.parametrize("extra, param", COMMON + COMPLETION_ONLY)
def test_completion_400_names_the_field(server: RemoteServer, extra: dict, param: str) -> None:
    check_400(post(server, "/v1/completions", {"prompt": "x", **extra}), param)


@pytest.mark.parametrize("extra, param", COMMON + CHAT_ONLY)
def test_chat_400_names_the_field(server: RemoteServer, extra: dict, param: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], **extra}
    check_400(post(server, "/v1/chat/completions", body), param)


def test_missing_prompt_names_prompt(server: RemoteServer) -> None:
    check_400(httpx.post(server.url + "/v1/completions", json={"model": MODEL}), "prompt")


@pytest.mark.parametrize(
    "route, body",
    [
        ("/v1/completions", {"prompt": "x"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ],
)
def test_n_limit_message(server: RemoteServer, route: str, body: dict) -> None:
    err = check_400(post(server, route, {**body, "n": MAX_N + 1, "max_tokens": 1}), "n")
    assert f"n must be at most {MAX_N}, got {MAX_N + 1}" in err["message"]
    assert "PAGEDKV_MAX_N_SEQUENCES" in err["message"]
    err = check_400(post(server, route, {**body, "n": 0}), "n")
    assert "n must be at least 1" in err["message"]
    # At the limit (and with n null, which OpenAI allows and means 1) the request runs.
    ok = post(server, route, {**body, "n": MAX_N, "max_tokens": 1, "temperature": 1.0})
    assert ok.status_code == 200, ok.text
    assert sorted(c["index"] for c in ok.json()["choices"]) == list(range(MAX_N))
    ok = post(server, route, {**body, "n": None, "max_tokens": 1})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 1, ok.text


def test_chat_max_completion_tokens_wins_over_max_tokens(server: RemoteServer) -> None:
    body = {
        "messages": [{"role": "user", "content": "Count to ten."}],
        "temperature": 0,
        "ignore_eos": True,
    }
    out = post(
        server, "/v1/chat/completions", {**body, "max_completion_tokens": 3, "max_tokens": 9}
    ).json()
    assert out["usage"]["completion_tokens"] == 3
    out = post(server, "/v1/chat/completions", {**body, "max_tokens": 4}).json()
    assert out["usage"]["completion_tokens"] == 4


def test_invalid_unicode_is_a_400_on_a_connection_that_stays_open(server: RemoteServer) -> None:
    """A lone surrogate ("\\ud800") used to give a 500 and reset the keep-alive connection."""
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for route, body, param in (
            ("/v1/completions", {"prompt": "a\ud800"}, "prompt"),
            (
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "\udfff"}]},
                "messages.0.content",
            ),
            ("/tokenize", {"prompt": "\ud800"}, "prompt"),
        ):
            r = client.post(
                route,
                content=json.dumps({"model": MODEL, **body}),
                headers={"Content-Type": "application/json"},
            )
            check_400(r, param)
            # A server about to drop the connection says "Connection: close"; this one keeps it.
            assert r.headers.get("connection", "keep-alive").lower() != "close", r.headers
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1})
        assert r.status_code == 200, r.text


def test_zz_server_alive_and_idle(server: RemoteServer) -> None:
    m = server.wait_idle()
    assert m["pagedkv:engine_dead"] == 0
    assert m["pagedkv:num_requests_running"] == 0 and m["pagedkv:kv_cache_usage_perc"] == 0
    assert "Traceback" not in server.log(), server.log()
