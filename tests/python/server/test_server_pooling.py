"""The pooling routes: `pagedkv serve --task embed` answering the official openai client
(client.embeddings.create, float and base64) and httpx (/pooling, /score, /rerank), the same
vectors as LLM.embed; a cross-encoder's /score, /rerank and /classify; each kind of model
refusing the other's routes with a 400 naming its task."""

from __future__ import annotations

import base64
import json
import os

import numpy as np
import pytest
import torch
from support.deps import need

httpx = need("httpx")
openai = need("openai")

from pagedkv import LLM  # noqa: E402
from pagedkv.engine.pooling_params import PoolingParams  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402
from support.server import small_server  # noqa: E402

TEXTS = ["hello world", "Paged attention keeps the KV cache in blocks.", "a b c d e f"]


def _embedding_folder(root: str) -> str:
    """A causal LM checkpoint with sentence-transformers files: MEAN pooling, Normalize."""
    path = save_random_model(root, "tiny-llama", seed=4, head_dim=32, is_matryoshka=True)
    kinds = [("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Normalize", "Normalize")]
    modules = [
        {"idx": i, "name": str(i), "path": p, "type": f"sentence_transformers.models.{kind}"}
        for i, (p, kind) in enumerate(kinds)
    ]
    with open(os.path.join(path, "modules.json"), "w") as f:
        json.dump(modules, f)
    os.makedirs(os.path.join(path, "1_Pooling"))
    with open(os.path.join(path, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": 64, "pooling_mode_mean_tokens": True}, f)
    os.makedirs(os.path.join(path, "2_Normalize"))
    return path


@pytest.fixture(scope="module")
def embed_model(tmp_path_factory) -> str:
    return _embedding_folder(str(tmp_path_factory.mktemp("embed_model")))


@pytest.fixture(scope="module")
def server(tmp_path_factory, embed_model: str):
    srv = small_server(
        tmp_path_factory,
        "pooling_server",
        model="emb",
        max_model_len=128,
        extra_args=["--model", embed_model, "--task", "embed"],
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def local(embed_model: str) -> LLM:
    return LLM(embed_model, task="embed", device="cpu", kv_cache_space=0.02, max_model_len=128)


def test_openai_client_embeddings(server, local: LLM) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    got = client.embeddings.create(model="emb", input=TEXTS)
    expected = [o.outputs.embedding for o in local.embed(TEXTS, use_tqdm=False)]
    assert [d.index for d in got.data] == [0, 1, 2]
    np.testing.assert_allclose([d.embedding for d in got.data], expected, rtol=1e-5, atol=1e-6)
    n = sum(len(local.get_tokenizer().encode(t)) for t in TEXTS)
    assert got.usage.prompt_tokens == got.usage.total_tokens == n
    # base64: the client asks for it by default without numpy decoding; decode it here too.
    raw = httpx.post(
        server.url + "/v1/embeddings",
        json={"model": "emb", "input": TEXTS[1], "encoding_format": "base64"},
    ).json()
    vec = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vec, expected[1], rtol=1e-5, atol=1e-6)
    # dimensions (the checkpoint is Matryoshka): cut, then normalised.
    short = client.embeddings.create(model="emb", input=TEXTS[0], dimensions=16).data[0]
    ref = local.embed(TEXTS[0], pooling_params=PoolingParams(dimensions=16), use_tqdm=False)
    np.testing.assert_allclose(short.embedding, ref[0].outputs.embedding, rtol=1e-5, atol=1e-6)
    assert len(short.embedding) == 16
    # token ids in, as the client sends them.
    ids = local.get_tokenizer().encode(TEXTS[2])
    by_ids = client.embeddings.create(model="emb", input=[ids]).data[0].embedding
    np.testing.assert_allclose(by_ids, expected[2], rtol=1e-5, atol=1e-6)


def test_pooling_score_rerank_routes(server, local: LLM) -> None:
    url = server.url
    pooled = httpx.post(url + "/pooling", json={"input": TEXTS[0]}).json()
    expected = local.embed(TEXTS, use_tqdm=False)
    np.testing.assert_allclose(
        pooled["data"][0]["data"], expected[0].outputs.embedding, rtol=1e-5, atol=1e-6
    )
    vec = torch.tensor([o.outputs.embedding for o in expected])
    cos = torch.nn.functional.cosine_similarity(vec[:1], vec, dim=-1)
    score = httpx.post(url + "/v1/score", json={"text_1": TEXTS[0], "text_2": TEXTS}).json()
    np.testing.assert_allclose([d["score"] for d in score["data"]], cos, rtol=1e-5, atol=1e-6)
    body = {"query": TEXTS[0], "documents": TEXTS[1:] + [TEXTS[0]], "top_n": 2}
    rerank = httpx.post(url + "/v1/rerank", json=body).json()
    results = rerank["results"]
    assert len(results) == 2 and results[0]["index"] == 2  # the query itself ranks first
    assert results[0]["document"]["text"] == TEXTS[0]
    assert results[0]["relevance_score"] >= results[1]["relevance_score"]


def test_pooling_server_refusals(server) -> None:
    url = server.url
    r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 400 and "pooling task 'embed'" in r.json()["error"]["message"]
    r = httpx.post(url + "/classify", json={"input": "hi"})
    assert r.status_code == 400 and "classify" in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/embeddings", json={"input": "hi", "encoding_format": "bytes"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "encoding_format"
    r = httpx.post(url + "/v1/embeddings", json={"input": "hi " * 300})
    assert r.status_code == 400
    server.wait_idle()


def _client(path: str, **kw):
    from fastapi.testclient import TestClient
    from pagedkv.engine.async_llm_engine import AsyncLLMEngine
    from pagedkv.entrypoints.openai.api_server import build_app

    engine = AsyncLLMEngine(model=path, device="cpu", kv_cache_space=0.02, max_model_len=128, **kw)
    return engine, TestClient(build_app(engine))


def test_cross_encoder_routes(tmp_path) -> None:
    transformers = need("transformers")
    path = save_random_model(
        str(tmp_path / "ce"),
        "tiny-llama",
        seed=6,
        head_dim=32,
        architectures=["LlamaForSequenceClassification"],
        num_labels=1,
        pad_token_id=0,
        id2label={"0": "relevant"},
    )
    ref = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    engine, client = _client(path)
    try:
        query, docs = "what is paged attention?", TEXTS
        with torch.no_grad():
            logits = [ref(torch.tensor([tok(query, d)["input_ids"]])).logits[0, 0] for d in docs]
        expected = torch.sigmoid(torch.stack(logits))
        scores = client.post("/score", json={"text_1": query, "text_2": docs}).json()
        got = [d["score"] for d in scores["data"]]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
        rerank = client.post("/rerank", json={"query": query, "documents": docs}).json()
        assert [r["index"] for r in rerank["results"]] == expected.argsort(descending=True).tolist()
        classify = client.post("/classify", json={"input": [docs[0]]}).json()["data"][0]
        assert classify["label"] == "relevant" and classify["num_classes"] == 1
        r = client.post("/v1/embeddings", json={"input": "hi"})
        assert r.status_code == 400 and "'classify'" in r.json()["error"]["message"]
    finally:
        engine.shutdown()


def test_generative_model_refuses_pooling_routes(tmp_path) -> None:
    path = save_random_model(str(tmp_path / "lm"), "tiny-llama", seed=2, head_dim=32)
    engine, client = _client(path)
    try:
        for route in ("/v1/embeddings", "/pooling", "/classify"):
            r = client.post(route, json={"input": "hi"})
            assert r.status_code == 400, route
            assert "generates text (task 'generate'" in r.json()["error"]["message"]
        r = client.post("/score", json={"text_1": "a", "text_2": "b"})
        assert r.status_code == 400
    finally:
        engine.shutdown()
