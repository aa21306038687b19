"""Pooling route fields that were accepted and ignored are honoured: a cross-encoder's /score
and /rerank build the text pair without special tokens when add_special_tokens is false (the
pair template's [CLS] / [SEP] were always added), and /rerank takes vLLM's `activation` as /score
does (it was logged as an ignored field). Scores against HF's model on the same tokens."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from support.deps import need

transformers = need("transformers")
need("httpx")
need("fastapi")

from fastapi.testclient import TestClient  # noqa: E402
from pagedkv.engine.async_llm_engine import AsyncLLMEngine  # noqa: E402
from pagedkv.testing import save_random_encoder  # noqa: E402
from support.server import in_process_app  # noqa: E402

QUERY, DOCS = "what is a panda", ["a bear of china", "paged attention"]


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("pool2_fields")
    return save_random_encoder(str(root / "bert"), "bert", num_labels=1, seed=6)


@pytest.fixture(scope="module")
def http(path: str):
    engine = AsyncLLMEngine(
        model=path, device="cpu", dtype="float32", kv_cache_space=0.02, max_model_len=64
    )
    with TestClient(in_process_app(engine), raise_server_exceptions=False) as client:
        yield client
    engine.shutdown()


def _hf_logits(path: str, special: bool) -> torch.Tensor:
    ref = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    with torch.no_grad():
        return torch.stack(
            [
                ref(**tok(QUERY, d, add_special_tokens=special, return_tensors="pt")).logits[0, 0]
                for d in DOCS
            ]
        )


def _post(http: TestClient, route: str, body: dict) -> dict:
    r = http.post(route, content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("special", [True, False])
def test_score_honours_add_special_tokens(http, path, special) -> None:
    body = {"text_1": QUERY, "text_2": DOCS, "add_special_tokens": special}
    got = [d["score"] for d in _post(http, "/score", body)["data"]]
    torch.testing.assert_close(torch.tensor(got), torch.sigmoid(_hf_logits(path, special)))
    rerank = _post(http, "/rerank", {"query": QUERY, "documents": DOCS, **body})
    by_index = {r["index"]: r["relevance_score"] for r in rerank["results"]}
    torch.testing.assert_close(torch.tensor([by_index[0], by_index[1]]), torch.tensor(got))


def test_rerank_takes_activation(http, path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="pagedkv.server"):
        out = _post(http, "/rerank", {"query": QUERY, "documents": DOCS, "activation": False})
    assert "ignored" not in caplog.text
    by_index = {r["index"]: r["relevance_score"] for r in out["results"]}
    torch.testing.assert_close(torch.tensor([by_index[0], by_index[1]]), _hf_logits(path, True))
