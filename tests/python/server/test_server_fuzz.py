"""Property-based fuzzing of every route, from the server's own OpenAPI schema (schemathesis):
valid and invalid bodies, headers and values that the schema allows or breaks, against the tiny
random model. A fixed, small budget (CI-friendly); asserts no 5xx, the engine alive afterwards
and no KV block leaked."""

from __future__ import annotations

import argparse
import time

import pytest
from support.deps import need

need("torch")
need("schemathesis")

import schemathesis  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from pagedkv.engine.async_llm_engine import AsyncLLMEngine  # noqa: E402
from pagedkv.entrypoints.openai.api_server import build_app  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

# Small limits keep each fuzzed request cheap on the tiny model (n, lists, bodies).
LIMITS = dict(
    max_n_sequences=4,
    max_stop_strings=8,
    max_bad_words=8,
    max_word_chars=64,
    max_logit_bias=16,
    max_request_body_size=256 * 1024,
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    path = save_random_model(
        str(tmp_path_factory.mktemp("fuzz_model")),
        "tiny-llama",
        seed=7,
        head_dim=32,
        max_position_embeddings=256,
    )
    eng = AsyncLLMEngine(
        model=path,
        device="cpu",
        dtype="float32",
        block_size=8,
        num_gpu_blocks_override=64,
        max_model_len=64,
        max_num_seqs=8,
        max_logprobs=5,
    )
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def app(engine: AsyncLLMEngine):
    return build_app(engine, argparse.Namespace(**LIMITS))


@pytest.fixture(scope="module")
def api_schema(app):  # type: ignore[no-untyped-def]
    loaded = schemathesis.openapi.from_asgi("/openapi.json", app)
    # Bodies that break the schema too (wrong types, missing fields), not only valid ones.
    loaded.config.generation.update(modes=list(schemathesis.GenerationMode))
    return loaded


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_route_answers_5xx(case) -> None:  # type: ignore[no-untyped-def]
    response = case.call(timeout=60)
    assert response.status_code < 500, (
        case.method,
        case.path,
        case.body,
        response.status_code,
        response.text[:500],
    )


def test_zz_engine_alive_and_nothing_leaked(engine: AsyncLLMEngine, app: object) -> None:
    from fastapi.testclient import TestClient

    with TestClient(app) as http:
        assert http.get("/health").status_code == 200
        r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200, r.text
    assert not engine.is_dead
    inner = engine.engine
    deadline = time.monotonic() + 30
    while inner.requests or inner.scheduler.num_free_blocks != inner.num_gpu_blocks:
        assert time.monotonic() < deadline, ("KV blocks leaked", engine.get_stats())
        time.sleep(0.05)
