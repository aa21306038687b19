"""Hub ids resolved as vLLM / transformers do, against a fake Hugging Face cache on disk (no
network): the cache under HF_HOME with HF_HUB_OFFLINE=1, download_dir, revisions, a separate
tokenizer revision, and the error when the model is neither cached nor downloadable."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.deps import need

torch = need("torch")
need("huggingface_hub")

from pagedkv import LLM  # noqa: E402
from pagedkv.models import load_model, resolve_model  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

REPO = "tiny-org/tiny-llama"
MAIN, DEV = "a" * 40, "b" * 40


def _fake_cache(root: str) -> str:
    """HF's cache layout: models--org--name/{refs/<branch>, snapshots/<commit>/<files>}; main
    and dev hold checkpoints of different vocabularies (so a test can tell which it read)."""
    repo = os.path.join(root, "models--" + REPO.replace("/", "--"))
    for branch, commit, vocab in (("main", MAIN, 256), ("dev", DEV, 320)):
        save_random_model(
            os.path.join(repo, "snapshots", commit),
            "tiny-llama",
            seed=1,
            tokenizer=False,
            vocab_size=vocab,
            head_dim=32,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
        os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
        with open(os.path.join(repo, "refs", branch), "w") as f:
            f.write(commit)
    return root


def test_download_dir_and_revision(tmp_path) -> None:
    cache = _fake_cache(str(tmp_path / "hub"))
    src = resolve_model(REPO, download_dir=cache)
    assert src.kind == "hf" and src.path.endswith(MAIN) and src.name == REPO
    _, config = load_model(REPO, torch.float32, "cpu", revision="dev", download_dir=cache)
    assert config.vocab_size == 320
    _, config = load_model(REPO, torch.float32, "cpu", revision=MAIN, download_dir=cache)
    assert config.vocab_size == 256


def test_llm_serves_a_cached_hub_id(tmp_path) -> None:
    cache = _fake_cache(str(tmp_path / "hub"))
    llm = LLM(
        REPO,
        download_dir=cache,
        revision="dev",
        skip_tokenizer_init=True,
        device="cpu",
        num_gpu_blocks_override=16,
        max_model_len=64,
    )
    assert llm.llm_engine.model_config.vocab_size == 320
    out = llm.generate({"prompt_token_ids": [5, 6, 7]}, use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) > 0


def _run_offline(home: str, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HOME": home, "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    env.pop("HUGGINGFACE_HUB_CACHE", None)
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def test_hf_home_offline_cache_first(tmp_path) -> None:
    home = str(tmp_path / "home")
    _fake_cache(os.path.join(home, "hub"))  # HF_HOME/hub is the default cache
    code = (
        "from pagedkv.models import resolve_model\n"
        f"print(resolve_model({REPO!r}).path)\n"
        "try:\n"
        "    resolve_model('tiny-org/absent')\n"
        "except FileNotFoundError as e:\n"
        "    print('ERROR', e)\n"
    )
    done = _run_offline(home, code)
    assert done.returncode == 0, done.stderr
    found, error = done.stdout.strip().splitlines()
    assert found == os.path.join(home, "hub", "models--tiny-org--tiny-llama", "snapshots", MAIN)
    assert error.startswith("ERROR model 'tiny-org/absent' is not in the Hugging Face cache")
    assert "HF_HUB_OFFLINE=1" in error


def test_tokenizer_revision(tmp_path, monkeypatch) -> None:
    """The tokenizer comes from its own revision of the repository (offline: a revision
    without tokenizer files is an error, not a download of the weights)."""
    from huggingface_hub import constants
    from pagedkv.engine.tokenizer import Tokenizer

    cache = _fake_cache(str(tmp_path / "hub"))
    snap = os.path.join(cache, "models--tiny-org--tiny-llama", "snapshots", DEV)
    save_random_model(str(tmp_path / "tok"), "tiny-llama", tokenizer=True)
    for name in os.listdir(tmp_path / "tok"):
        if name.startswith(("tokenizer", "special_tokens")):
            os.replace(tmp_path / "tok" / name, os.path.join(snap, name))
    tok = Tokenizer.from_pretrained(REPO, revision="dev", download_dir=cache)
    assert tok.encode("hello world")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match="not in the Hugging Face cache"):
        Tokenizer.from_pretrained(REPO, revision="main", download_dir=cache)


def test_paths_that_are_not_hub_ids_are_not_looked_up(tmp_path) -> None:
    for name in ("./missing-dir", str(tmp_path / "absent"), "../x/y"):
        with pytest.raises(FileNotFoundError, match="not found"):
            resolve_model(name)
    with open(tmp_path / "c.json", "w") as f:
        json.dump({}, f)
    with pytest.raises(ValueError, match="not a .gguf file"):
        resolve_model(str(tmp_path / "c.json"))
