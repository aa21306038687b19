"""LLM.classify / score / reward on tiny random *ForSequenceClassification checkpoints against
HF transformers (float32, CPU): class probabilities = softmax of HF's logits, a cross-encoder's
score = sigmoid of HF's logit for the tokenizer's (query, document) pair, per-token rewards =
the score head over every token's final hidden state."""

from __future__ import annotations

import pytest
import torch
from support.deps import need

transformers = need("transformers")

from pagedkv import LLM  # noqa: E402
from pagedkv.engine.pooling_params import PoolingParams  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

TEXTS = ["hello world", "The giant panda is a bear native to China.", "Paris", "x y z " * 9]


def _classifier(root, arch: str, labels: int, preset: str = "tiny-llama") -> str:
    extra = dict(head_dim=32) if preset == "tiny-llama" else {}
    return save_random_model(
        str(root), preset, seed=7, architectures=[arch], num_labels=labels, pad_token_id=0, **extra
    )


@pytest.fixture(scope="module")
def three_labels(tmp_path_factory) -> str:
    return _classifier(tmp_path_factory.mktemp("cls3"), "LlamaForSequenceClassification", 3)


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory) -> str:
    return _classifier(
        tmp_path_factory.mktemp("ce"), "Qwen3ForSequenceClassification", 1, "tiny-qwen3"
    )


def _llm(path: str, **kw) -> LLM:
    return LLM(path, device="cpu", kv_cache_space=0.02, max_model_len=128, **kw)


def _hf(path: str):
    return transformers.AutoModelForSequenceClassification.from_pretrained(
        path, dtype=torch.float32
    ).eval()


@torch.no_grad()
def _hf_logits(model, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids])).logits[0]


def test_classify_matches_hf(three_labels: str) -> None:
    llm = _llm(three_labels)  # task "auto": a classifier classifies
    assert llm.llm_engine.task == "classify"
    ref = _hf(three_labels)
    outs = llm.classify(TEXTS, use_tqdm=False)
    for out in outs:
        logits = _hf_logits(ref, out.prompt_token_ids)
        assert out.outputs.num_classes == 3
        torch.testing.assert_close(
            torch.tensor(out.outputs.probs), logits.softmax(-1), rtol=1e-4, atol=1e-5
        )
    raw = llm.classify(TEXTS[1], pooling_params=PoolingParams(use_activation=False))[0]
    expected = _hf_logits(ref, raw.prompt_token_ids)
    torch.testing.assert_close(torch.tensor(raw.outputs.probs), expected, rtol=1e-4, atol=1e-4)


def test_cross_encoder_score_matches_hf(cross_encoder: str) -> None:
    llm = _llm(cross_encoder, task="score")
    ref = _hf(cross_encoder)
    tok = transformers.AutoTokenizer.from_pretrained(cross_encoder)
    query, docs = "What is a panda?", TEXTS
    outs = llm.score(query, docs, use_tqdm=False)
    assert len(outs) == len(docs)
    for doc, out in zip(docs, outs):
        ids = tok(query, doc)["input_ids"]
        assert out.prompt_token_ids == ids
        expected = torch.sigmoid(_hf_logits(ref, ids))[0]
        assert abs(out.outputs.score - expected.item()) < 1e-5
    pairwise = llm.score(docs[:2], docs[2:], use_tqdm=False)
    ids = tok(docs[1], docs[3])["input_ids"]
    assert abs(pairwise[1].outputs.score - torch.sigmoid(_hf_logits(ref, ids))[0].item()) < 1e-5
    with pytest.raises(ValueError, match="data_1 has 2 items and data_2 3"):
        llm.score(docs[:2], docs[:3])


@torch.no_grad()
def test_reward_scores_every_token(three_labels: str) -> None:
    llm = _llm(three_labels, task="reward")
    ref = _hf(three_labels)
    out = llm.reward(TEXTS[1], use_tqdm=False)[0]
    ids = torch.tensor([out.prompt_token_ids])
    hidden = ref.model(ids).last_hidden_state[0]
    torch.testing.assert_close(out.outputs.data, ref.score(hidden), rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_step_reward(three_labels: str) -> None:
    llm = _llm(three_labels, task="reward", pooler_config={"pooling_type": "STEP"})
    ref = _hf(three_labels)
    prompt = [5, 9, 7, 9, 11, 9]
    params = PoolingParams(step_tag_id=9, returned_token_ids=[0, 2])
    out = llm.reward({"prompt_token_ids": prompt}, pooling_params=params, use_tqdm=False)[0]
    scores = ref.score(ref.model(torch.tensor([prompt])).last_hidden_state[0])
    expected = scores[torch.tensor(prompt) == 9][:, [0, 2]].softmax(-1)
    torch.testing.assert_close(out.outputs.data, expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="STEP pooling"):
        _llm(three_labels, task="reward").reward("x", pooling_params=PoolingParams(step_tag_id=9))


def test_task_checks(three_labels: str, tmp_path) -> None:
    with pytest.raises(ValueError, match="one output label"):
        _llm(three_labels).score("a", "b")
    with pytest.raises(ValueError, match="sequence-classification model.*task='classify'"):
        _llm(three_labels, task="generate")
    causal = save_random_model(str(tmp_path / "lm"), "tiny-llama", seed=1, head_dim=32)
    with pytest.raises(ValueError, match="needs a \\*ForSequenceClassification"):
        _llm(causal, task="classify")
    with pytest.raises(ValueError, match="runner='generate' contradicts"):
        _llm(causal, task="embed", runner="generate")
    # convert="embed": a causal LM's last-token hidden states, normalised (vLLM's defaults).
    emb = _llm(causal, convert="embed").embed("hello", use_tqdm=False)[0].outputs.embedding
    assert abs(torch.tensor(emb).norm().item() - 1.0) < 1e-5
