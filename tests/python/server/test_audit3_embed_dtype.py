"""/v1/embeddings and /pooling with vLLM's embed_dtype and endianness: they were ignored (a
client asking for float16 base64 decoded float32 bytes as float16: wrong numbers, no error).
A base64 answer now holds the values in that type and byte order; unknown values are a 400
naming the field."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest
from support.deps import need

torch = need("torch")
need("fastapi")
need("transformers")

from fastapi.testclient import TestClient  # noqa: E402
from pagedkv.engine.async_llm_engine import AsyncLLMEngine  # noqa: E402
from pagedkv.entrypoints.openai.api_server import build_app  # noqa: E402
from pagedkv.testing import save_random_encoder  # noqa: E402


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model = save_random_encoder(str(tmp_path_factory.mktemp("audit3_embed")), "bert")
    eng = AsyncLLMEngine(model=model, device="cpu", kv_cache_space=0.01, max_model_len=64)
    with TestClient(build_app(eng), raise_server_exceptions=False) as client:
        yield client
    eng.shutdown()


def _decode(text: str, dtype: torch.dtype, big: bool) -> torch.Tensor:
    raw = np.frombuffer(base64.b64decode(text), dtype=np.uint8)
    size = torch.empty(0, dtype=dtype).element_size()
    if big:
        raw = raw.reshape(-1, size)[:, ::-1]
    return torch.from_numpy(np.ascontiguousarray(raw).reshape(-1)).view(dtype).float()


@pytest.mark.parametrize(
    ("name", "dtype"),
    [("float32", torch.float32), ("float16", torch.float16), ("bfloat16", torch.bfloat16)],
)
@pytest.mark.parametrize("endianness", ["native", "little", "big"])
def test_base64_embeddings_in_the_asked_type(http: Any, name, dtype, endianness) -> None:
    body = {"input": ["hello world", "b"], "encoding_format": "float"}
    floats = [d["embedding"] for d in http.post("/v1/embeddings", json=body).json()["data"]]
    body.update(encoding_format="base64", embed_dtype=name, endianness=endianness)
    resp = http.post("/v1/embeddings", json=body)
    assert resp.status_code == 200, resp.text
    for want, got in zip(floats, resp.json()["data"]):
        vec = _decode(got["embedding"], dtype, endianness == "big")
        expected = torch.tensor(want).to(dtype).float()
        assert torch.equal(vec, expected), name


def test_fp8_and_pooling_route(http: Any) -> None:
    body = {"input": "hello", "encoding_format": "base64", "embed_dtype": "fp8_e4m3"}
    resp = http.post("/pooling", json=body)
    assert resp.status_code == 200, resp.text
    raw = base64.b64decode(resp.json()["data"][0]["data"])
    plain = http.post("/pooling", json={"input": "hello"}).json()["data"][0]["data"]
    assert len(raw) == len(plain)  # one byte per value


@pytest.mark.parametrize(("field", "value"), [("embed_dtype", "int8"), ("endianness", "middle")])
def test_unknown_values_are_refused_by_name(http: Any, field: str, value: str) -> None:
    resp = http.post(
        "/v1/embeddings", json={"input": "a", "encoding_format": "base64", field: value}
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == field
