"""Property-based fuzzing of the pooling routes (/v1/embeddings, /pooling, /classify, /score,
/rerank) from the server's own OpenAPI schema (schemathesis), against a tiny random BERT
cross-encoder (its text pairs, token types and classifier head; /v1/embeddings answers it with a
400): valid and invalid bodies, no 5xx, the engine alive afterwards and no KV block leaked. A
small fixed budget, still about a minute on a loaded 2-core CPU: marked slow."""

from __future__ import annotations

import pytest
from support.deps import need
from support.fuzz import assert_alive_and_idle, assert_no_5xx, openapi_schema
from support.server import in_process_app

need("torch")
need("transformers")
need("schemathesis")

import schemathesis  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from pagedkv.engine.async_llm_engine import AsyncLLMEngine  # noqa: E402
from pagedkv.testing import save_random_encoder  # noqa: E402

pytestmark = pytest.mark.slow

POOLING_PATHS = r"^/(v1/embeddings|pooling|classify|v1/score|score|rerank|v1/rerank|v2/rerank)$"
LIMITS = dict(max_request_body_size=64 * 1024)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("pool2_fuzz")
    path = save_random_encoder(str(root), "bert", num_labels=1, seed=3)
    eng = AsyncLLMEngine(
        model=path, device="cpu", dtype="float32", kv_cache_space=0.02, max_model_len=64
    )
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def app(engine: AsyncLLMEngine):
    return in_process_app(engine, **LIMITS)


@pytest.fixture(scope="module")
def api_schema(app):  # type: ignore[no-untyped-def]
    return openapi_schema(app, POOLING_PATHS)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_pooling_route_answers_5xx(case) -> None:  # type: ignore[no-untyped-def]
    assert_no_5xx(case)


def test_zz_engine_alive_and_nothing_leaked(engine: AsyncLLMEngine, app: object) -> None:
    assert_alive_and_idle(engine, app, "/pooling", {"input": "hi"})
