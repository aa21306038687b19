"""Audit 2026-11-27: with --enable-request-id-headers the server refused an unsafe X-Request-Id
with a 400 but echoed the raw header back (control characters, non-ASCII, 5000 characters) in
that 400's own X-Request-Id response header."""

from __future__ import annotations

import argparse

import pytest
from support.deps import need

need("torch")
need("fastapi")
need("httpx")

from fastapi.testclient import TestClient  # noqa: E402
from pagedkv.engine.async_llm_engine import AsyncLLMEngine  # noqa: E402
from pagedkv.entrypoints.openai.api_server import build_app  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory):
    path = save_random_model(
        str(tmp_path_factory.mktemp("audit_rid")),
        "tiny-llama",
        seed=3,
        head_dim=32,
        max_position_embeddings=128,
    )
    eng = AsyncLLMEngine(
        model=path,
        device="cpu",
        dtype="float32",
        block_size=8,
        num_gpu_blocks_override=32,
        max_model_len=64,
        max_num_seqs=4,
    )
    app = build_app(eng, argparse.Namespace(enable_request_id_headers=True))
    with TestClient(app) as client:
        yield client
    eng.shutdown()


@pytest.mark.parametrize(
    "rid", [b"abc\x01def", b"a" * 5000, "\u00fc".encode()], ids=["control", "long", "non-ascii"]
)
def test_refused_request_id_is_not_echoed(http, rid: bytes):
    r = http.post(
        "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers=[(b"x-request-id", rid)]
    )
    assert r.status_code == 400 and "X-Request-Id" in r.json()["error"]["message"]
    echoed = r.headers["x-request-id"].encode("latin-1")
    assert echoed != rid and echoed.isascii() and echoed.decode().isprintable()


def test_safe_request_id_is_echoed(http):
    r = http.post(
        "/v1/completions",
        json={"prompt": "hi", "max_tokens": 2},
        headers={"x-request-id": "ok-id_1"},
    )
    assert r.status_code == 200 and r.headers["x-request-id"] == "ok-id_1"
