"""Image size limit (issue #25): a data: URL of a few kilobytes can hold an 8000 x 8000 PNG that
took 11 s to decode on the tokenizer thread. `--max-image-pixels` (default 4096 x 4096) refuses
an image over it from its header, before decoding, with a 400 naming the message part; the
offline engine's limit is RequestLimits.max_image_pixels (None: no limit, as vLLM's LLM)."""

from __future__ import annotations

import argparse
import base64
import io
import struct
import zlib
from typing import Any

import pytest
from support.deps import need

need("torch")
need("fastapi")
need("httpx")
need("PIL")

from fastapi.testclient import TestClient  # noqa: E402
from pagedkv.engine.async_llm_engine import AsyncLLMEngine  # noqa: E402
from pagedkv.engine.input_processor import RequestLimits  # noqa: E402
from pagedkv.engine.multimodal import load_image_url  # noqa: E402
from pagedkv.entrypoints.cli import build_parser  # noqa: E402
from pagedkv.entrypoints.openai.api_server import build_app  # noqa: E402
from pagedkv.entrypoints.openai.limits import LIMIT_DEFAULTS  # noqa: E402
from pagedkv.testing import IMAGE_TOKEN, save_random_llava  # noqa: E402
from PIL import Image  # noqa: E402

ENGINE = dict(device="cpu", dtype="float32", block_size=8, kv_cache_space=0.02, max_model_len=128)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _header_only_png(width: int, height: int) -> str:
    """A PNG that declares width x height and holds no pixel data: decoding it fails, so a
    refusal by size shows that the size was read from the header alone."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    raw = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IEND", b"")
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def _png(width: int, height: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (10, 200, 30)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_size_is_checked_from_the_header_before_decoding() -> None:
    url = _header_only_png(8000, 8000)
    with pytest.raises(ValueError, match=r"part: the image is 8000x8000 = 64000000 pixels, more"):
        load_image_url(url, "part", max_pixels=LIMIT_DEFAULTS["max_image_pixels"])
    with pytest.raises(ValueError, match="not a readable image"):  # (no limit: it decodes)
        load_image_url(url, "part")
    assert load_image_url(_png(40, 30), "part", max_pixels=1200).size == (40, 30)


def test_flag_is_documented_and_reaches_the_limits() -> None:
    help_text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    assert "--max-image-pixels" in help_text
    args = build_parser().parse_args(["serve", "m", "--max-image-pixels", "100"])
    assert args.max_image_pixels == 100
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "m", "--max-image-pixels", "0"])


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model = save_random_llava(str(tmp_path_factory.mktemp("robust_pixels")), seed=5)
    eng = AsyncLLMEngine(model=model, **ENGINE)
    yield eng
    eng.shutdown()


def _chat(client: Any, url: str) -> Any:
    part = {"type": "image_url", "image_url": {"url": url}}
    return client.post(
        "/v1/chat/completions",
        json={
            "model": client.app.state.pagedkv.model_name,
            "messages": [{"role": "user", "content": [part, {"type": "text", "text": "What?"}]}],
            "max_tokens": 2,
        },
    )


def test_server_refuses_an_image_over_the_flag(llava: Any) -> None:
    args = argparse.Namespace(max_image_pixels=1000)
    with TestClient(build_app(llava, args), raise_server_exceptions=False) as client:
        resp = _chat(client, _png(40, 30))
        assert resp.status_code == 400, resp.text
        message = resp.json()["error"]["message"]
        assert "messages[0]" in message and "1200 pixels" in message, message
        assert "max_image_pixels (1000)" in message
        assert _chat(client, _png(20, 20)).status_code == 200
    with TestClient(build_app(llava), raise_server_exceptions=False) as client:  # the default
        resp = _chat(client, _header_only_png(8000, 8000))
        assert resp.status_code == 400 and "64000000 pixels" in resp.text, resp.text


def test_offline_limit_on_pil_images(llava: Any) -> None:
    processor = llava.engine.input_processor
    prompt = {
        "prompt": f"{IMAGE_TOKEN}\nWhat?",
        "multi_modal_data": {"image": Image.new("RGB", (40, 30))},
    }
    with pytest.raises(
        ValueError, match=r"prompt\['multi_modal_data'\]\['image'\]\[0\]: the image"
    ):
        processor.process("r", prompt, None, limits=RequestLimits(max_image_pixels=1000))
    assert processor.process("r", prompt, None).mm is not None  # no limit by default
