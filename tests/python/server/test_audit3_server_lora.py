"""LoRA on the server, as a user meets it: `--lora-modules` adapters, more adapters over time
than --max-loras / --max-cpu-loras places (each was refused for good once the places had been
used: "all are in device slots"), and an adapter registered under the base model's own name
(it silently took over the base model's requests)."""

from __future__ import annotations

import argparse
import shutil

import pytest
from support.deps import need
from support.peft_adapters import save_peft_adapter

torch = need("torch")
transformers = need("transformers")
peft = need("peft")
need("fastapi")

from fastapi.testclient import TestClient  # noqa: E402
from pagedkv.engine.async_llm_engine import AsyncLLMEngine  # noqa: E402
from pagedkv.entrypoints.arg_types import CLIError  # noqa: E402
from pagedkv.entrypoints.openai.api_server import build_app  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("audit3_lora")
    base = save_random_model(
        str(d / "base"), "tiny-llama", seed=5, head_dim=32, max_position_embeddings=128
    )
    modules = []
    for i, targets in enumerate((["q_proj"], ["v_proj", "down_proj"], ["up_proj"])):
        save_peft_adapter(base, str(d / f"a{i}"), targets, seed=i + 11)
        modules.append(f"a{i}={d / f'a{i}'}")
    engine = AsyncLLMEngine(
        model=base,
        device="cpu",
        dtype="float32",
        enable_lora=True,
        max_loras=1,
        max_model_len=128,
        num_gpu_blocks_override=32,
        max_num_seqs=4,
    )
    yield engine, modules, str(d / "a0")
    engine.shutdown()


def _client(engine, monkeypatch, modules) -> TestClient:
    monkeypatch.setenv("PAGEDKV_ALLOW_RUNTIME_LORA_UPDATING", "1")
    args = argparse.Namespace(lora_modules=modules, served_model_name="base")
    return TestClient(build_app(engine, args), raise_server_exceptions=False)


def _text(client, model: str) -> str:
    body = {"model": model, "prompt": "The fox", "max_tokens": 5, "temperature": 0}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_more_adapters_than_places_take_turns(served, monkeypatch) -> None:
    engine, modules, _ = served
    client = _client(engine, monkeypatch, modules)
    ids = [c["id"] for c in client.get("/v1/models").json()["data"]]
    assert ids == ["base", "a0", "a1", "a2"]
    first = [_text(client, name) for name in ("a0", "a1", "a2", "base")]
    assert len(set(first)) == 4  # each adapter really ran
    assert [_text(client, name) for name in ("a2", "a0", "base", "a1")] == [
        first[2],
        first[0],
        first[3],
        first[1],
    ]


def test_adapter_may_not_take_the_base_models_name(served, monkeypatch) -> None:
    engine, _, path = served
    client = _client(engine, monkeypatch, [])
    before = _text(client, "base")
    r = client.post("/v1/load_lora_adapter", json={"lora_name": "base", "lora_path": path})
    assert r.status_code == 400 and "name of the base model" in r.json()["error"]["message"]
    assert _text(client, "base") == before
    assert [c["id"] for c in client.get("/v1/models").json()["data"]] == ["base"]


def test_unreadable_lora_module_is_a_flag_error(served, tmp_path) -> None:
    engine, _, _ = served
    args = argparse.Namespace(lora_modules=[f"bad={tmp_path}"], served_model_name="base")
    with pytest.raises(CLIError, match="argument --lora-modules: .*no adapter_config.json"):
        build_app(engine, args)


def test_deleted_adapter_fails_its_requests_alone(served, monkeypatch, tmp_path) -> None:
    # (issue #25) An adapter folder deleted while its adapter is out of host memory and of the
    # device slot: its requests get an error naming it, the others are served.
    engine, modules, _ = served
    gone = tmp_path / "gone"
    shutil.copytree(modules[1].split("=", 1)[1], gone)
    client = _client(engine, monkeypatch, modules + [f"gone={gone}"])
    want = _text(client, "base")
    _text(client, "a0")  # evicts 'gone' from the host cache and the slot
    shutil.rmtree(gone)
    body = {"model": "gone", "prompt": "The fox", "max_tokens": 5, "temperature": 0}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 400 and "gone" in r.text, r.text
    assert _text(client, "base") == want
