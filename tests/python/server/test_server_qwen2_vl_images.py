"""OpenAI image_url content parts on /v1/chat/completions for a Qwen2-VL model, against the app
in process: the part becomes <|vision_start|><|image_pad|><|vision_end|> in the rendered text
and a data: URL image answers what the offline engine answers for the same image and text
(itself equal to HF: tests/python/models/test_models_qwen2_vl.py)."""

from __future__ import annotations

from pathlib import Path

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
from pagedkv.testing import save_random_qwen2_vl  # noqa: E402

ENGINE = dict(device="cpu", dtype="float32", block_size=8, kv_cache_space=0.02, max_model_len=128)
QUESTION = "What is in this picture?"
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


def test_data_url_image_answers_as_offline(tmp_path: Path) -> None:
    model = save_random_qwen2_vl(str(tmp_path), seed=9)
    image = random_image(4, 60, 90)
    eng = AsyncLLMEngine(model=model, **ENGINE)
    try:
        with TestClient(build_app(eng), raise_server_exceptions=False) as http:
            part = {"type": "image_url", "image_url": {"url": png_data_url(image)}}
            resp = chat_with_image(http, part, QUESTION)
    finally:
        eng.shutdown()
    assert resp.status_code == 200, resp.text
    got = resp.json()["choices"][0]["token_ids"]
    assert got == offline_chat_answer(LLM(model, **ENGINE), IMAGE, QUESTION, image)
