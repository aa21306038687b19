"""/tokenize of chat messages with image_url parts on a LLaVA model: it answered "image inputs
are not supported: the model takes text only". It now gives the tokens a chat request with the
same messages feeds the model (each image's placeholders included), and a bad image is a 400
naming the messages."""

from __future__ import annotations

from typing import Any

import pytest
from support.deps import need
from support.images import png_data_url, random_image

need("torch")
need("fastapi")
need("httpx")
need("PIL")

from fastapi.testclient import TestClient  # noqa: E402
from pagedkv.engine.async_llm_engine import AsyncLLMEngine  # noqa: E402
from pagedkv.entrypoints.openai.api_server import build_app  # noqa: E402
from pagedkv.testing import save_random_llava  # noqa: E402


def _data_url(seed: int) -> str:
    return png_data_url(random_image(seed, 30, 40))


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model = save_random_llava(str(tmp_path_factory.mktemp("audit3_llava")), seed=2)
    eng = AsyncLLMEngine(
        model=model, device="cpu", dtype="float32", kv_cache_space=0.02, max_model_len=128
    )
    with TestClient(build_app(eng), raise_server_exceptions=False) as client:
        yield client
    eng.shutdown()


def _messages(url: str) -> list:
    parts = [{"type": "text", "text": "Two:"}, {"type": "image_url", "image_url": {"url": url}}]
    parts.append({"type": "image_url", "image_url": {"url": _data_url(9)}})
    return [{"role": "user", "content": parts}]


def test_tokenize_counts_what_chat_feeds_the_model(http: Any) -> None:
    messages = _messages(_data_url(1))
    tok = http.post("/tokenize", json={"messages": messages})
    assert tok.status_code == 200, tok.text
    chat = http.post(
        "/v1/chat/completions",
        json={"messages": messages, "max_tokens": 1, "return_token_ids": True},
    )
    assert chat.status_code == 200, chat.text
    assert tok.json()["tokens"] == chat.json()["prompt_token_ids"]
    assert tok.json()["count"] == chat.json()["usage"]["prompt_tokens"]
    image_token = http.app.state.pagedkv.engine.input_processor.images.image_token_id
    assert tok.json()["tokens"].count(image_token) == 2 * 16  # two images of 16 patches


def test_tokenize_refuses_a_bad_image_by_name(http: Any) -> None:
    resp = http.post("/tokenize", json={"messages": _messages("data:image/png;base64,aGk=")})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"].startswith("messages")
    assert "not a readable image" in resp.json()["error"]["message"]
