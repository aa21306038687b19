"""Property-based fuzzing of every route, from the server's own OpenAPI schema (schemathesis):
valid and invalid bodies, headers and values that the schema allows or breaks, against the tiny
random model. A fixed, small budget (CI-friendly); asserts no 5xx, the engine alive afterwards
and no KV block leaked."""

from __future__ import annotations

import pytest
from support.deps import need
from support.fuzz import assert_alive_and_idle, assert_no_5xx, openapi_schema
from support.server import in_process_app, tiny_async_engine

need("torch")
need("schemathesis")

import schemathesis  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from pagedkv.engine.async_llm_engine import AsyncLLMEngine  # noqa: E402

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
    eng = tiny_async_engine(
        tmp_path_factory, "fuzz_model", seed=7, max_model_len=64, max_logprobs=5
    )
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def app(engine: AsyncLLMEngine):
    return in_process_app(engine, **LIMITS)


@pytest.fixture(scope="module")
def api_schema(app):  # type: ignore[no-untyped-def]
    return openapi_schema(app)


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
    assert_no_5xx(case)


def test_zz_engine_alive_and_nothing_leaked(engine: AsyncLLMEngine, app: object) -> None:
    assert_alive_and_idle(engine, app, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
