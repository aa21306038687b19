"""Image files in chat `image_url` parts (issue #33: "data: URLs and files"), as vLLM's
--allowed-local-media-path reads them: file:// URLs only under that directory (after resolving
symlinks and '..'), answering what the same image as a data: URL answers; without the flag, or
outside the directory, a 400 naming the part and the flag. The app in process on a tiny random
LLaVA."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import pytest
from support.deps import need
from support.images import chat_with_image, png_data_url, random_image

need("torch")
need("fastapi")
need("httpx")
need("PIL")

from fastapi.testclient import TestClient  # noqa: E402
from pagedkv.engine.async_llm_engine import AsyncLLMEngine  # noqa: E402
from pagedkv.entrypoints.openai.api_server import build_app  # noqa: E402
from pagedkv.testing import save_random_llava  # noqa: E402

ENGINE = dict(device="cpu", dtype="float32", block_size=8, kv_cache_space=0.02, max_model_len=128)
QUESTION = "What is in this picture?"


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("media")
    (root / "allowed").mkdir()
    random_image(1, 30, 40).save(root / "allowed" / "cat.png")
    random_image(1, 30, 40).save(root / "allowed" / "100%25.png")  # ('%' in a file name)
    random_image(2, 30, 40).save(root / "secret.png")
    os.symlink(root / "secret.png", root / "allowed" / "link.png")
    (root / "allowed" / "notes.txt").write_text("not an image")
    return root


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_random_llava(str(tmp_path_factory.mktemp("llava_files")), seed=5)


@pytest.fixture(scope="module")
def engine(model: str, media: Path) -> Any:
    eng = AsyncLLMEngine(model=model, allowed_local_media_path=str(media / "allowed"), **ENGINE)
    yield eng
    eng.shutdown()


def _client(engine: Any) -> TestClient:
    return TestClient(build_app(engine, argparse.Namespace()), raise_server_exceptions=False)


def _image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def test_a_file_under_the_allowed_path_answers_as_its_data_url(engine: Any, media: Path) -> None:
    with _client(engine) as http:
        from_file = chat_with_image(
            http, _image((media / "allowed" / "cat.png").as_uri()), QUESTION
        )
        assert from_file.status_code == 200, from_file.text
        inline = chat_with_image(http, _image(png_data_url(random_image(1, 30, 40))), QUESTION)
        other = chat_with_image(http, _image(png_data_url(random_image(2, 30, 40))), QUESTION)
    got = from_file.json()["choices"][0]["token_ids"]
    assert got == inline.json()["choices"][0]["token_ids"]
    assert got != other.json()["choices"][0]["token_ids"]  # the image reached the model


def test_a_percent_in_a_file_name_is_decoded_once(engine: Any, media: Path) -> None:
    """file:///.../100%2525.png names the file '100%25.png' (not '100%.png')."""
    with _client(engine) as http:
        named = chat_with_image(http, _image((media / "allowed" / "100%25.png").as_uri()), QUESTION)
        cat = chat_with_image(http, _image((media / "allowed" / "cat.png").as_uri()), QUESTION)
    assert named.status_code == 200, named.text
    assert named.json()["choices"][0]["token_ids"] == cat.json()["choices"][0]["token_ids"]


@pytest.mark.parametrize(
    "name, message",
    [
        ("../secret.png", "outside --allowed-local-media-path"),
        ("link.png", "outside --allowed-local-media-path"),  # a symlink out of the directory
        ("missing.png", "no such image file"),
        ("notes.txt", "not a readable image"),
        (".", "no such image file"),  # the directory itself
    ],
)
def test_files_outside_or_unreadable_are_400(
    engine: Any, media: Path, name: str, message: str
) -> None:
    url = "file://" + str(media / "allowed") + "/" + name
    with _client(engine) as http:
        r = chat_with_image(http, _image(url), QUESTION)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert message in err["message"] and err["param"] == "messages.0.content", err
    assert str(media / "secret.png") not in err["message"]  # nothing about other files leaks


def test_offline_chat_reads_files_under_the_path(model: str, media: Path) -> None:
    """LLM.chat honours the same engine argument (vLLM's LLM(allowed_local_media_path=))."""
    from pagedkv import LLM, SamplingParams

    def answer(llm: Any, url: str) -> list:
        messages = [{"role": "user", "content": [_image(url), {"type": "text", "text": "Hi"}]}]
        out = llm.chat(messages, SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)
        return list(out[0].outputs[0].token_ids)

    llm = LLM(model, allowed_local_media_path=str(media / "allowed"), **ENGINE)
    from_file = answer(llm, (media / "allowed" / "cat.png").as_uri())
    assert from_file == answer(llm, png_data_url(random_image(1, 30, 40)))
    with pytest.raises(ValueError, match="outside --allowed-local-media-path"):
        answer(llm, (media / "secret.png").as_uri())
    with pytest.raises(ValueError, match="allowed_local_media_path must be an existing"):
        LLM(model, allowed_local_media_path=str(media / "nope"), **ENGINE)


def test_the_flag_is_checked_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from pagedkv.entrypoints.cli import build_parser

    parser = build_parser()
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["serve", "--allowed-local-media-path", str(tmp_path / "nope")])
    assert exc.value.code == 2
    assert "argument --allowed-local-media-path: must be an existing directory" in (
        capsys.readouterr().err
    )
    args = parser.parse_args(["serve", "--allowed-local-media-path", str(tmp_path)])
    assert args.allowed_local_media_path == str(tmp_path.resolve())
