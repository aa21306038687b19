"""use_beam_search and best_of on /v1/completions and /v1/chat/completions, against the app in
process (httpx through Starlette's TestClient) on a tiny random Llama with a tokenizer.

The server's hypotheses must be those of the offline LLM.beam_search on the same checkpoint
(itself checked against HF in tests/python/engine/test_beam_search.py): the n best of a beam
of width best_of (or n), their text the decoded tokens. What beam search cannot honour is a 400
naming the field. best_of > n without beam search samples best_of and returns the n with the
highest cumulative logprob (vLLM's meaning).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support.deps import need
from support.server import wait_engine_idle

need("torch")
need("fastapi")
need("httpx")

from fastapi.testclient import TestClient  # noqa: E402
from pagedkv import LLM, BeamSearchParams  # noqa: E402
from pagedkv.engine.async_llm_engine import AsyncLLMEngine  # noqa: E402
from pagedkv.entrypoints.openai.api_server import build_app  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

ENGINE = dict(
    device="cpu", dtype="float32", block_size=8, num_gpu_blocks_override=96, max_model_len=128
)
PROMPTS = ["The capital of France is", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_random_model(
        str(tmp_path_factory.mktemp("beam_server")), "tiny-llama", seed=4, head_dim=32
    )


@pytest.fixture(scope="module")
def engine(model: str) -> Any:
    eng = AsyncLLMEngine(model=model, **ENGINE)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def offline(model: str) -> Any:
    return LLM(model, **ENGINE)


@pytest.fixture(scope="module")
def http(engine: Any) -> Any:
    with TestClient(build_app(engine), raise_server_exceptions=False) as client:
        yield client


def expected(offline: Any, prompt: Any, width: int, n: int, lp: float = 1.0) -> list:
    params = BeamSearchParams(width, 6, ignore_eos=True, length_penalty=lp)
    (out,) = offline.beam_search([prompt], params)
    return [(s.generated_token_ids, s.text) for s in out.sequences[:n]]


def test_completions_beam_search_equals_offline(http: Any, engine: Any, offline: Any) -> None:
    body = {
        "prompt": PROMPTS,
        "use_beam_search": True,
        "n": 2,
        "best_of": 3,
        "length_penalty": 0.5,
        "max_tokens": 6,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    for i, prompt in enumerate(PROMPTS):
        got = [(c["token_ids"], c["text"]) for c in choices[2 * i : 2 * i + 2]]
        assert got == expected(offline, prompt, width=3, n=2, lp=0.5)
        assert all(c["finish_reason"] == "length" for c in choices[2 * i : 2 * i + 2])
    assert r.json()["usage"]["completion_tokens"] == 4 * 6
    wait_engine_idle(engine)


def test_chat_beam_search_equals_offline(http: Any, engine: Any, offline: Any) -> None:
    body = {
        "messages": [{"role": "user", "content": "Name a color."}],
        "use_beam_search": True,
        "n": 2,
        "max_tokens": 6,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    prompt = {"prompt_token_ids": data["prompt_token_ids"]}
    got = [(c["token_ids"], c["message"]["content"]) for c in data["choices"]]
    assert got == expected(offline, prompt, width=2, n=2)
    wait_engine_idle(engine)


REFUSED = [
    ({"use_beam_search": True, "stream": True}, "stream"),
    ({"use_beam_search": True, "top_p": 0.5}, "top_p"),
    ({"use_beam_search": True, "stop": ["x"]}, "stop"),
    ({"use_beam_search": True, "logit_bias": {"5": 3}}, "logit_bias"),
    ({"use_beam_search": True, "temperature": 0.7}, "temperature"),
    ({"use_beam_search": True, "n": 3, "best_of": 2}, "n"),
    ({"use_beam_search": True, "best_of": 11}, "best_of"),  # 22 logprobs > max_logprobs 20
    ({"use_beam_search": True, "priority": 3}, "priority"),  # fcfs: the engine's rule
    ({"length_penalty": 0.5}, "length_penalty"),
    ({"best_of": 2, "stream": True, "temperature": 1.0}, "best_of"),
    ({"best_of": 2, "temperature": 0.0}, "best_of"),  # greedy samples would all match
]


@pytest.mark.parametrize("extra, param", REFUSED, ids=[p for _, p in REFUSED])
def test_what_beam_search_cannot_honour_is_refused_by_name(
    http: Any, extra: dict, param: str
) -> None:
    for route, body in (
        ("/v1/completions", {"prompt": "hi"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ):
        r = http.post(route, json={**body, "max_tokens": 2, **extra})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param, r.text


def test_best_of_returns_the_most_likely_samples(http: Any, engine: Any) -> None:
    """best_of=3, n=1 is the n=3 sample (same seed: the same samples) with the highest
    cumulative logprob."""
    body = {"prompt": PROMPTS[0], "max_tokens": 6, "temperature": 1.0, "seed": 7}
    r = http.post("/v1/completions", json={**body, "n": 3, "logprobs": 0})
    assert r.status_code == 200, r.text
    samples = [(sum(c["logprobs"]["token_logprobs"]), c["text"]) for c in r.json()["choices"]]
    assert len({text for _, text in samples}) > 1, "the samples are all alike: tests nothing"
    r = http.post("/v1/completions", json={**body, "n": 1, "best_of": 3})
    assert r.status_code == 200, r.text
    assert [c["text"] for c in r.json()["choices"]] == [max(samples)[1]]
    wait_engine_idle(engine)


def test_a_cancelled_beam_search_aborts_its_requests(engine: Any) -> None:
    """A client gone mid-search (the handler's task cancelled) leaves nothing in the engine."""
    from pagedkv.engine.beam_search import beam_search_async

    ids = engine.tokenizer.encode(PROMPTS[1])
    params = BeamSearchParams(4, 100, ignore_eos=True)
    steps = []

    async def run() -> None:
        task = asyncio.ensure_future(beam_search_async(engine, "gone", ids, params))
        while not engine.engine.requests:  # until a step's beam requests are in
            await asyncio.sleep(0.005)
        steps.append(len(engine.engine.requests))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert steps and steps[0] >= 1
    wait_engine_idle(engine)
