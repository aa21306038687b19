"""The server fuzz tests' shared parts (test_server_fuzz.py: every route on a generative model;
test_pool2_pooling_fuzz.py: the pooling routes on a cross-encoder): the app's OpenAPI schema
with valid and invalid bodies, the no-5xx check of one case, and the check that the engine is
alive and holds nothing afterwards."""

from __future__ import annotations

from typing import Any, Dict, Optional

from support.server import wait_engine_idle


def openapi_schema(app: Any, path_regex: Optional[str] = None) -> Any:
    """schemathesis' view of ``app``'s own schema (its routes matching ``path_regex``), with
    bodies that break it too (wrong types, missing fields), not only valid ones."""
    import schemathesis

    loaded = schemathesis.openapi.from_asgi("/openapi.json", app)
    loaded.config.generation.update(modes=list(schemathesis.GenerationMode))
    return loaded if path_regex is None else loaded.include(path_regex=path_regex)


def assert_no_5xx(case: Any) -> None:
    response = case.call(timeout=60)
    assert response.status_code < 500, (
        case.method,
        case.path,
        case.body,
        response.status_code,
        response.text[:500],
    )


def assert_alive_and_idle(engine: Any, app: Any, path: str, body: Dict[str, Any]) -> None:
    """/health answers, a plain request to ``path`` succeeds, and no KV block is left."""
    from fastapi.testclient import TestClient

    with TestClient(app) as http:
        assert http.get("/health").status_code == 200
        r = http.post(path, json=body)
        assert r.status_code == 200, r.text
    assert not engine.is_dead
    wait_engine_idle(engine, timeout=30)
