"""LoRA adapters on the server: --lora-modules (name=path and the JSON form), a request's model
naming an adapter runs with it (greedy text equal to HF's PEFT-merged model), /v1/models lists
each adapter with root and parent, and the runtime load / unload routes exist only when
PAGEDKV_ALLOW_RUNTIME_LORA_UPDATING (or VLLM_ALLOW_RUNTIME_LORA_UPDATING) is true."""

from __future__ import annotations

import argparse
import json

import pytest
from support.deps import need
from support.peft_adapters import save_peft_adapter

torch = need("torch")
transformers = need("transformers")
peft = need("peft")
need("fastapi")

from fastapi.testclient import TestClient  # noqa: E402
from pagedkv.engine.async_llm_engine import AsyncLLMEngine  # noqa: E402
from pagedkv.entrypoints.openai.api_server import build_app  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora_server")
    base = save_random_model(
        str(d / "base"), "tiny-llama", seed=4, head_dim=32, max_position_embeddings=256
    )
    adapters = []
    for i, targets in enumerate((["q_proj", "v_proj", "down_proj"], ["k_proj", "up_proj"])):
        adapters.append(save_peft_adapter(base, str(d / f"a{i}"), targets, seed=i + 1))
    engine = AsyncLLMEngine(
        model=base,
        device="cpu",
        dtype="float32",
        enable_lora=True,
        max_loras=2,
        max_cpu_loras=3,
        max_model_len=128,
        num_gpu_blocks_override=64,
        max_num_seqs=8,
    )
    yield base, adapters, engine
    engine.shutdown()


def _client(engine, monkeypatch, allow: bool, modules: list[str]) -> TestClient:
    monkeypatch.delenv("PAGEDKV_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    if allow:
        monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    else:
        monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    app = build_app(engine, argparse.Namespace(lora_modules=modules, served_model_name="base"))
    return TestClient(app, raise_server_exceptions=False)


def _merged_text(base: str, adapter: str, tokenizer, n: int) -> str:
    m = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    m = peft.PeftModel.from_pretrained(m, adapter).merge_and_unload().eval()
    ids = tokenizer.encode(PROMPT)
    with torch.no_grad():
        out = m.generate(
            torch.tensor([ids]),
            max_new_tokens=n,
            do_sample=False,
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        )
    return tokenizer.decode(out[0, len(ids) :].tolist())


def test_adapters_by_name(world, monkeypatch) -> None:
    base, adapters, engine = world
    modules = [
        f"first={adapters[0]}",
        json.dumps({"name": "second", "path": adapters[1], "base_model_name": "base"}),
    ]
    with _client(engine, monkeypatch, False, modules) as http:
        cards = {c["id"]: c for c in http.get("/v1/models").json()["data"]}
        assert cards["first"]["root"] == adapters[0] and cards["first"]["parent"] == "base"
        assert cards["second"]["root"] == adapters[1] and cards["base"]["parent"] is None
        texts = {}
        for name in ("base", "first", "second"):
            r = http.post(
                "/v1/completions",
                json={"model": name, "prompt": PROMPT, "max_tokens": 5, "temperature": 0},
            )
            assert r.status_code == 200, r.text
            texts[name] = r.json()["choices"][0]["text"]
            assert r.json()["model"] == name
        assert len(set(texts.values())) == 3, texts
        hf_tok = transformers.AutoTokenizer.from_pretrained(base)
        assert texts["first"] == _merged_text(base, adapters[0], hf_tok, 5)
        assert (
            http.post(
                "/v1/completions", json={"model": "third", "prompt": PROMPT, "max_tokens": 2}
            ).status_code
            == 404
        )
        assert (
            http.post(
                "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": adapters[0]}
            ).status_code
            == 404
        )


def test_runtime_load_and_unload(world, monkeypatch) -> None:
    base, adapters, engine = world
    with _client(engine, monkeypatch, True, []) as http:
        r = http.post("/v1/load_lora_adapter", json={"lora_name": "late", "lora_path": adapters[1]})
        assert r.status_code == 200, r.text
        assert "late" in {c["id"] for c in http.get("/v1/models").json()["data"]}
        r = http.post(
            "/v1/completions",
            json={"model": "late", "prompt": PROMPT, "max_tokens": 3, "temperature": 0},
        )
        assert r.status_code == 200, r.text
        assert (
            http.post(
                "/v1/load_lora_adapter", json={"lora_name": "late", "lora_path": adapters[1]}
            ).status_code
            == 400
        )
        assert http.post("/v1/unload_lora_adapter", json={"lora_name": "late"}).status_code == 200
        assert (
            http.post(
                "/v1/completions", json={"model": "late", "prompt": PROMPT, "max_tokens": 2}
            ).status_code
            == 404
        )
        assert http.post("/v1/unload_lora_adapter", json={"lora_name": "late"}).status_code == 404
