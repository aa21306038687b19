"""OpenAI image_url content parts on /v1/chat/completions for a LLaVA model, against the app in
process: a data: URL (base64 PNG) answers what the offline engine answers for the same image
and the same rendered prompt (itself equal to HF: tests/python/models/test_models_llava.py);
http(s) URLs are refused unless --allowed-media-domains lists the host (no network here: only
the refusal is tested), broken data URLs are a 400 naming the message."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from support.deps import need
from support.images import chat_with_image, offline_chat_answer, png_data_url, random_image

need("torch")
need("fastapi")
need("httpx")
need("PIL")

from fastapi.testclient import TestClient  # noqa: E402
from pagedkv import LLM  # noqa: E402
from pagedkv.engine.async_llm_engine import AsyncLLMEngine  # noqa: E402
from pagedkv.entrypoints.openai.api_server import build_app  # noqa: E402
from pagedkv.testing import IMAGE_TOKEN, save_random_llava  # noqa: E402

ENGINE = dict(device="cpu", dtype="float32", block_size=8, kv_cache_space=0.02, max_model_len=128)
QUESTION = "What is in this picture?"


def _png(seed: int) -> tuple[Any, str]:
    image = random_image(seed, 30, 40)
    return image, png_data_url(image)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_random_llava(str(tmp_path_factory.mktemp("llava_server")), seed=5)


@pytest.fixture(scope="module")
def http(model: str) -> Any:
    eng = AsyncLLMEngine(model=model, **ENGINE)
    with TestClient(build_app(eng), raise_server_exceptions=False) as client:
        yield client
    eng.shutdown()


def _chat(http: Any, part: dict) -> Any:
    return chat_with_image(http, part, QUESTION)


def test_data_url_image_answers_as_offline(http: Any, model: str) -> None:
    image, url = _png(1)
    resp = _chat(http, {"type": "image_url", "image_url": {"url": url}})
    assert resp.status_code == 200, resp.text
    got = resp.json()["choices"][0]["token_ids"]
    # Offline: the same template over "<image>\n" + the text (vLLM's placement), same image.
    assert got == offline_chat_answer(LLM(model, **ENGINE), IMAGE_TOKEN, QUESTION, image)
    # Another image, another answer (the image reached the model).
    other = _chat(http, {"type": "image_url", "image_url": {"url": _png(2)[1]}})
    assert other.status_code == 200 and other.json()["choices"][0]["token_ids"] != got


@pytest.mark.parametrize(
    "url, message",
    [
        ("https://example.com/cat.png", "start the server with --allowed-media-domains"),
        ("file:///etc/passwd", "--allowed-local-media-path"),
        ("ftp://example.com/cat.png", "must be data:, http(s) or file: URLs"),
        ("data:image/png;base64,@@@", "not valid base64"),
        ("data:image/png;base64," + base64.b64encode(b"not an image").decode(), "not a readable"),
    ],
)
def test_bad_image_urls_are_400(http: Any, url: str, message: str) -> None:
    resp = _chat(http, {"type": "image_url", "image_url": {"url": url}})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert message in err["message"]
    assert err["param"] == "messages.0.content"
