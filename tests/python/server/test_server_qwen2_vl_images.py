"""OpenAI image_url content parts on /v1/chat/completions for a Qwen2-VL model, against the app
in process: the part becomes <|vision_start|><|image_pad|><|vision_end|> in the rendered text
and a data: URL image answers what the offline engine answers for the same image and text
(itself equal to HF: tests/python/models/test_models_qwen2_vl.py)."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
from support.deps import need

need("torch")
need("fastapi")
need("httpx")
need("PIL")

from fastapi.testclient import TestClient  # noqa: E402
from pagedkv import LLM, SamplingParams  # noqa: E402
from pagedkv.engine.async_llm_engine import AsyncLLMEngine  # noqa: E402
from pagedkv.entrypoints.openai.api_server import build_app  # noqa: E402
from pagedkv.testing import save_random_qwen2_vl  # noqa: E402
from PIL import Image  # noqa: E402

ENGINE = dict(device="cpu", dtype="float32", block_size=8, kv_cache_space=0.02, max_model_len=128)
QUESTION = "What is in this picture?"
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


def test_data_url_image_answers_as_offline(tmp_path: Path) -> None:
    model = save_random_qwen2_vl(str(tmp_path), seed=9)
    rng = np.random.default_rng(4)
    image = Image.fromarray(rng.integers(0, 256, (60, 90, 3), dtype=np.uint8))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    eng = AsyncLLMEngine(model=model, **ENGINE)
    try:
        with TestClient(build_app(eng), raise_server_exceptions=False) as http:
            part = {"type": "image_url", "image_url": {"url": url}}
            resp = http.post(
                "/v1/chat/completions",
                json={
                    "model": http.app.state.pagedkv.model_name,
                    "messages": [
                        {"role": "user", "content": [part, {"type": "text", "text": QUESTION}]}
                    ],
                    "max_tokens": 6,
                    "temperature": 0,
                    "return_token_ids": True,
                },
            )
    finally:
        eng.shutdown()
    assert resp.status_code == 200, resp.text
    got = resp.json()["choices"][0]["token_ids"]
    llm = LLM(model, **ENGINE)
    text = llm.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": f"{IMAGE}\n{QUESTION}"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    params = SamplingParams(temperature=0, max_tokens=6)
    want = llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, params)
    assert got == list(want[0].outputs[0].token_ids)
