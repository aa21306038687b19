"""The OpenAI-compatible server end to end: a real `python -m pagedkv serve` subprocess on the
default model, driven by the official `openai` client (and raw HTTP where the client would not
send the request). One server per module; the last test checks that no KV block is left."""

from __future__ import annotations

import asyncio
import json

import pytest
from support.deps import need

httpx = need("httpx")
openai = need("openai")

from support.server import RemoteServer  # noqa: E402

API_KEY = "test-key-123"
MODEL = "smol"
PROMPT = "The capital of France is"
MAX_MODEL_LEN = 256


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("server")
    config = tmp / "config.yaml"
    # The file's port is wrong on purpose: the command-line --port must win over it.
    config.write_text(
        'host: "127.0.0.1"\nport: 1\nuvicorn-log-level: "warning"\n'
        f"max-model-len: {MAX_MODEL_LEN}\ntrust-request-chat-template: true\n"
    )
    srv = RemoteServer(
        [
            "--config",
            str(config),
            "--served-model-name",
            MODEL,
            "--kv-cache-space",
            "0.1",
            "--max-num-seqs",
            "32",
        ],
        tmp / "server.log",
        env={"PAGEDKV_API_KEY": API_KEY},
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: RemoteServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def greedy(client: openai.OpenAI, prompt: str = PROMPT, max_tokens: int = 12, **kw):
    return client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, **kw
    )


def test_models_health_version(server: RemoteServer, client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert httpx.get(server.url + "/health").status_code == 200  # no key needed for probes
    version = httpx.get(server.url + "/version").json()["version"]
    assert isinstance(version, str) and version[0].isdigit()


def test_completion(client: openai.OpenAI) -> None:
    out = greedy(client)
    assert out.id.startswith("cmpl-") and out.object == "text_completion"
    assert out.model == MODEL
    (choice,) = out.choices
    assert choice.text and choice.finish_reason in ("length", "stop")
    assert out.usage.completion_tokens <= 12 and out.usage.completion_tokens > 0
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    if choice.finish_reason == "length":
        assert out.usage.completion_tokens == 12
    # Greedy decoding is deterministic.
    assert greedy(client).choices[0].text == choice.text


@pytest.mark.parametrize("stop", [None, ["\n", " the"]])
def test_completion_stream_matches(client: openai.OpenAI, stop) -> None:
    full = greedy(client, max_tokens=16, stop=stop)
    if stop:
        assert not any(s in full.choices[0].text for s in stop)
    chunks = list(
        greedy(
            client, max_tokens=16, stop=stop, stream=True, stream_options={"include_usage": True}
        )
    )
    *text_chunks, usage_chunk = chunks
    assert all(c.id == chunks[0].id and c.id.startswith("cmpl-") for c in chunks)
    assert "".join(c.choices[0].text for c in text_chunks) == full.choices[0].text
    reasons = [c.choices[0].finish_reason for c in text_chunks]
    assert reasons[-1] == full.choices[0].finish_reason and all(r is None for r in reasons[:-1])
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == full.usage.completion_tokens
    assert usage_chunk.usage.prompt_tokens == full.usage.prompt_tokens


def test_prompt_forms(server: RemoteServer, client: openai.OpenAI) -> None:
    ids = httpx.post(server.url + "/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    assert (
        httpx.post(server.url + "/detokenize", json={"tokens": ids}).json()["prompt"].strip()
        == PROMPT
    )
    text = greedy(client).choices[0].text
    assert greedy(client, prompt=ids).choices[0].text == text
    batch = greedy(client, prompt=[PROMPT, "Once upon a time", PROMPT])
    assert [c.index for c in batch.choices] == [0, 1, 2]
    assert batch.choices[0].text == text and batch.choices[2].text == text
    batch_ids = greedy(client, prompt=[ids, ids])
    assert [c.text for c in batch_ids.choices] == [text, text]


def test_n_and_seed(client: openai.OpenAI) -> None:
    kw = dict(
        model=MODEL, prompt=["Tell me a story", "Hi"], max_tokens=8, n=3, temperature=1.0, seed=1234
    )
    a = client.completions.create(**kw)
    assert sorted(c.index for c in a.choices) == list(range(6))
    assert 6 <= a.usage.completion_tokens <= 6 * 8
    b = client.completions.create(**kw)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]  # same seed, same text
    streamed: dict = {}
    for ch in client.completions.create(**kw, stream=True):
        for c in ch.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert [streamed[i] for i in range(6)] == [c.text for c in a.choices]


def test_logprobs_and_echo(client: openai.OpenAI) -> None:
    out = greedy(client, max_tokens=6, logprobs=3, echo=True)
    (c,) = out.choices
    assert c.text.startswith(PROMPT)
    lp = c.logprobs
    n = out.usage.prompt_tokens + out.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == n
    assert lp.token_logprobs[0] is None and lp.text_offset[0] == 0
    assert lp.text_offset == sorted(lp.text_offset)
    for i in range(out.usage.prompt_tokens, n):  # the generated part, greedy
        top = lp.top_logprobs[i]
        assert 3 <= len(top) <= 4
        # Greedy picks the most likely token: its logprob is the largest of the top ones.
        assert lp.token_logprobs[i] == pytest.approx(max(top.values()), abs=1e-4)
        assert lp.token_logprobs[i] <= 0.0
    plain = greedy(client, max_tokens=6, logprobs=2)
    assert PROMPT + plain.choices[0].text == c.text
    assert len(plain.choices[0].logprobs.tokens) == out.usage.completion_tokens


def test_chat(client: openai.OpenAI) -> None:
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2 + 2?"},
    ]
    out = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0
    )
    assert out.id.startswith("chatcmpl-") and out.object == "chat.completion"
    msg = out.choices[0].message
    assert msg.role == "assistant" and msg.content
    parts = [
        dict(messages[0]),
        {"role": "user", "content": [{"type": "text", "text": "What is 2 + 2?"}]},
    ]
    same = client.chat.completions.create(model=MODEL, messages=parts, max_tokens=16, temperature=0)
    assert same.choices[0].message.content == msg.content
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.id == chunks[0].id and c.id.startswith("chatcmpl-") for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == msg.content
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == out.choices[0].finish_reason and not any(reasons[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == out.usage.total_tokens


def test_chat_template_override(server: RemoteServer, client: openai.OpenAI) -> None:
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=12,
        temperature=0,
        extra_body={"chat_template": template},
    )
    # The template renders the bare prompt, so chat must match a plain completion.
    ref = httpx.post(
        server.url + "/tokenize", json={"prompt": PROMPT, "add_special_tokens": False}
    ).json()
    assert out.usage.prompt_tokens == ref["count"]
    assert out.choices[0].message.content == greedy(client, prompt=ref["tokens"]).choices[0].text


def test_greedy_alone_equals_among_16_concurrent(server: RemoteServer) -> None:
    async def run() -> tuple[str, list[str]]:
        aclient = openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=180
        )
        kw = dict(model=MODEL, max_tokens=16, temperature=0)
        alone = (await aclient.completions.create(prompt=PROMPT, **kw)).choices[0].text
        other = "Question: why is the sky blue? Answer:"
        prompts = [PROMPT if i % 4 == 0 else other for i in range(16)]
        outs = await asyncio.gather(*[aclient.completions.create(prompt=p, **kw) for p in prompts])
        await aclient.close()
        return alone, [o.choices[0].text for o in outs]

    alone, together = asyncio.run(run())
    assert [together[i] for i in range(0, 16, 4)] == [alone] * 4
    others = [together[i] for i in range(16) if i % 4]
    assert others == [others[0]] * 12  # another greedy prompt, 12 copies batched together


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": PROMPT, "temperature": -1.0}, "temperature"),
        ({"prompt": PROMPT, "top_p": 0.0}, "top_p"),
        ({"prompt": PROMPT, "max_tokens": 0}, "max_tokens"),
        ({"prompt": PROMPT, "max_tokens": MAX_MODEL_LEN + 1}, "max_tokens"),
        ({"prompt": "hello " * (MAX_MODEL_LEN + 10)}, "prompt"),
        ({"prompt": PROMPT, "n": "many"}, "n"),
        ({}, "prompt"),
        ({"prompt": []}, "prompt"),
    ],
)
def test_bad_completion_requests_400(server: RemoteServer, body: dict, param: str) -> None:
    r = httpx.post(
        server.url + "/v1/completions",
        json={"model": MODEL, **body},
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param, err  # test_server_errors.py has the full table


def test_errors_with_openai_client(server: RemoteServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=PROMPT, temperature=-3)
    with pytest.raises(openai.BadRequestError, match="context length"):
        client.chat.completions.create(
            model=MODEL,
            max_tokens=8,
            messages=[{"role": "user", "content": "word " * MAX_MODEL_LEN}],
        )
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=2)
    bad_key = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.models.list()
    assert httpx.get(server.url + "/v1/models").status_code == 401
    for raw in ('{"prompt": "hi", ', "not json", '["a list"]'):
        r = httpx.post(
            server.url + "/v1/completions",
            content=raw,
            headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
        )
        assert r.status_code == 400 and "error" in r.json(), r.text
    r = httpx.post(
        server.url + "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ],
        },
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    assert r.status_code == 400
    # ... and the server still serves.
    assert server.metrics()["pagedkv:engine_dead"] == 0
    assert greedy(client, max_tokens=4).choices[0].text


def test_metrics_move(server: RemoteServer, client: openai.OpenAI) -> None:
    before = server.metrics()
    for name in (
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
        "prefix_cache_queries_total",
        "prefix_cache_hits_total",
        "num_preemptions_total",
        "prompt_tokens_total",
        "generation_tokens_total",
        "time_to_first_token_seconds_count",
        "time_per_output_token_seconds_count",
        "e2e_request_latency_seconds_count",
    ):
        assert "pagedkv:" + name in before
    out = greedy(
        client, prompt="Count: one, two, three,", max_tokens=10, extra_body={"ignore_eos": True}
    )
    after = server.metrics()
    assert out.usage.completion_tokens == 10
    assert (
        after["pagedkv:generation_tokens_total"] - before["pagedkv:generation_tokens_total"] == 10
    )
    assert (
        after["pagedkv:prompt_tokens_total"] - before["pagedkv:prompt_tokens_total"]
        == out.usage.prompt_tokens
    )
    assert (
        after["pagedkv:e2e_request_latency_seconds_count"]
        == before["pagedkv:e2e_request_latency_seconds_count"] + 1
    )
    assert (
        after["pagedkv:prefix_cache_queries_total"] >= before["pagedkv:prefix_cache_queries_total"]
    )


def test_disconnect_mid_stream_aborts(server: RemoteServer) -> None:
    server.wait_idle()
    before = server.metrics()["pagedkv:generation_tokens_total"]
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream(
        "POST",
        server.url + "/v1/completions",
        json=body,
        timeout=60,
        headers={"Authorization": f"Bearer {API_KEY}"},
    ) as r:
        events = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                json.loads(line[6:])
                events += 1
            if events == 3:
                break  # leaving the block closes the connection mid-stream
    m = server.wait_idle()
    assert m["pagedkv:num_requests_running"] == 0 and m["pagedkv:kv_cache_usage_perc"] == 0
    generated = m["pagedkv:generation_tokens_total"] - before
    assert 3 <= generated < 200, "the request ran on after its client left"


def test_zz_no_kv_block_left(server: RemoteServer) -> None:
    m = server.wait_idle()
    assert m["pagedkv:num_requests_running"] == 0
    assert m["pagedkv:num_requests_waiting"] == 0
    assert m["pagedkv:kv_cache_usage_perc"] == 0
    assert "Traceback" not in server.log(), server.log()
