"""A BERT cross-encoder behind the server: /score and /rerank score text pairs like HF's
BertForSequenceClassification on the tokenizer's pair encoding (segment B typed 1)."""

from __future__ import annotations

import numpy as np
import torch
from support.deps import need

httpx = need("httpx")
transformers = need("transformers")

from pagedkv.testing import save_random_encoder  # noqa: E402

DOCS = ["hello world", "the quick brown fox jumps over the lazy dog", "a"]


def test_bert_cross_encoder_score_and_rerank(tmp_path) -> None:
    from fastapi.testclient import TestClient
    from pagedkv.engine.async_llm_engine import AsyncLLMEngine
    from pagedkv.entrypoints.openai.api_server import build_app

    path = save_random_encoder(str(tmp_path / "bert_ce"), "bert", num_labels=1, seed=7)
    ref = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    query = "what is a panda?"
    with torch.no_grad():
        logits = torch.stack([ref(**tok(query, d, return_tensors="pt")).logits[0, 0] for d in DOCS])
    engine = AsyncLLMEngine(
        model=path, task="score", device="cpu", kv_cache_space=0.02, max_model_len=128
    )
    try:
        client = TestClient(build_app(engine))
        body = {"text_1": query, "text_2": DOCS, "use_activation": False}
        got = [d["score"] for d in client.post("/score", json=body).json()["data"]]
        np.testing.assert_allclose(got, logits.numpy(), rtol=1e-4, atol=1e-4)
        rerank = client.post("/rerank", json={"query": query, "documents": DOCS}).json()
        scores = {r["index"]: r["relevance_score"] for r in rerank["results"]}
        np.testing.assert_allclose(
            [scores[i] for i in range(len(DOCS))], torch.sigmoid(logits).numpy(), atol=1e-4
        )
        # truncate_prompt_tokens cuts ids and token types alike: HF on the last 6 tokens.
        enc = tok(query, DOCS[1])
        with torch.no_grad():
            cut = ref(
                input_ids=torch.tensor([enc["input_ids"][-6:]]),
                token_type_ids=torch.tensor([enc["token_type_ids"][-6:]]),
            ).logits[0, 0]
        body = {"text_1": query, "text_2": DOCS[1], "truncate_prompt_tokens": 6}
        got_cut = client.post("/score", json=body).json()["data"][0]["score"]
        assert abs(got_cut - torch.sigmoid(cut).item()) < 1e-4
    finally:
        engine.shutdown()
