"""BERT-family encoders through the pooling engine (non-causal attention: one prefill per
prompt, no prefix cache): a bare BertModel embeds with CLS pooling like sentence-transformers,
an XLM-RoBERTa cross-encoder (bge-reranker style) scores like HF; a BERT cross-encoder scores
text pairs like HF, its segment B typed 1 (token_type_ids)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support.deps import need

transformers = need("transformers")
need("sentence_transformers")

from pagedkv import LLM  # noqa: E402
from pagedkv.engine.pooling_params import PoolingParams  # noqa: E402
from pagedkv.testing import save_random_encoder, save_random_model  # noqa: E402

TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog", "a"]


def _llm(path: str, **kw) -> LLM:
    return LLM(path, device="cpu", kv_cache_space=0.02, max_model_len=128, **kw)


def test_bert_embeddings_match_sentence_transformers(tmp_path) -> None:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    path = save_random_encoder(str(tmp_path / "bert"), "bert", seed=3)
    llm = _llm(path)  # task "auto": an encoder embeds
    engine = llm.llm_engine
    assert engine.task == "embed" and engine.pooler.pooling_type("embed") == "CLS"
    assert not engine.config.enable_chunked_prefill and not engine.config.enable_prefix_caching
    got = torch.tensor([o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)])
    body = Transformer(path)
    st = SentenceTransformer(
        modules=[body, Pooling(body.get_embedding_dimension(), pooling_mode="cls"), Normalize()],
        device="cpu",
    )
    ref = st.encode(TEXTS, convert_to_tensor=True).float()
    assert F.cosine_similarity(got, ref, dim=-1).min().item() >= 0.9999
    # The same prompt twice: nothing comes from the cache (an encoder's keys see the future).
    again = llm.embed(TEXTS[1], use_tqdm=False)[0]
    assert again.num_cached_tokens == 0


def test_xlm_roberta_cross_encoder_scores_match_hf(tmp_path) -> None:
    path = save_random_encoder(str(tmp_path / "xlmr"), "xlm-roberta", num_labels=1, seed=4)
    llm = _llm(path, task="score")
    ref = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    query = "what is a panda?"
    got = [o.outputs.score for o in llm.score(query, TEXTS, use_tqdm=False)]
    with torch.no_grad():
        logits = [ref(**tok(query, t, return_tensors="pt")).logits[0, 0] for t in TEXTS]
    torch.testing.assert_close(torch.tensor(got), torch.sigmoid(torch.stack(logits)))


def _hf_logits(ref, enc: dict, keep: int = 0) -> torch.Tensor:
    """HF's logit of one encoded pair (its last ``keep`` tokens when given)."""
    ids, types = enc["input_ids"][-keep:], enc["token_type_ids"][-keep:]
    with torch.no_grad():
        out = ref(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types]))
    return out.logits[0, 0]


def test_bert_cross_encoder_pair_scores_match_hf(tmp_path) -> None:
    path = save_random_encoder(str(tmp_path / "bert_ce"), "bert", num_labels=1, seed=5)
    llm = _llm(path, task="score")
    ref = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    query = "what is a panda?"
    encs = [tok(query, t) for t in TEXTS]
    assert all(any(e["token_type_ids"]) for e in encs)  # segment B is typed 1
    raw = PoolingParams(use_activation=False)
    got = [o.outputs.score for o in llm.score(query, TEXTS, use_tqdm=False, pooling_params=raw)]
    expected = torch.stack([_hf_logits(ref, e) for e in encs])
    torch.testing.assert_close(torch.tensor(got), expected, rtol=1e-4, atol=1e-4)
    # The types matter: with segment B typed 0 the logits differ.
    untyped = [ref(input_ids=torch.tensor([e["input_ids"]])).logits[0, 0].item() for e in encs]
    assert max(abs(a - b) for a, b in zip(got, untyped)) > 1e-3
    # Default activation (sigmoid) and truncation cut ids and types alike (the last 6 tokens).
    cut = llm.score(query, TEXTS[1], use_tqdm=False, truncate_prompt_tokens=6)[0].outputs.score
    assert abs(cut - torch.sigmoid(_hf_logits(ref, encs[1], keep=6)).item()) < 1e-4
    # One text: its token types are all 0 (HF does the same without a pair).
    out = llm.classify(TEXTS[1], use_tqdm=False)[0]
    with torch.no_grad():
        logit = ref(**tok(TEXTS[1], return_tensors="pt")).logits[0, 0]
    assert abs(out.outputs.probs[0] - torch.sigmoid(logit).item()) < 1e-5


def test_token_type_ids_checked(tmp_path) -> None:
    path = save_random_encoder(str(tmp_path / "bert_ce"), "bert", num_labels=1, seed=6)
    llm = _llm(path, task="score")
    with pytest.raises(ValueError, match="token_type_ids.* 2 entries for 3"):
        llm.classify({"prompt_token_ids": [2, 5, 3], "token_type_ids": [0, 1]}, use_tqdm=False)
    with pytest.raises(ValueError, match=r"token_type_ids.*\[0, 2\)"):
        llm.classify({"prompt_token_ids": [2, 5, 3], "token_type_ids": [0, 1, 2]}, use_tqdm=False)
    # A model without token type embeddings refuses them by name (never ignores them).
    lm = save_random_model(str(tmp_path / "lm"), "tiny-llama", seed=2, head_dim=32)
    embed = _llm(lm, task="embed")
    with pytest.raises(ValueError, match="takes no token types"):
        embed.embed({"prompt_token_ids": [2, 5, 3], "token_type_ids": [0, 0, 1]}, use_tqdm=False)


def test_a_prompt_may_fill_max_model_len(tmp_path) -> None:
    """vLLM embeds a prompt of exactly max_model_len tokens (bge's 512): the placeholder token
    that ends a pooling request must not cost a position."""
    path = save_random_encoder(str(tmp_path / "bert"), "bert", seed=5)
    llm = _llm(path)  # max_model_len 128: the checkpoint's max_position_embeddings
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = tok("word " * 300, truncation=True, max_length=128)["input_ids"]
    assert len(ids) == 128
    got = torch.tensor(llm.embed({"prompt_token_ids": ids}, use_tqdm=False)[0].outputs.embedding)
    ref = transformers.AutoModel.from_pretrained(path).eval()
    with torch.no_grad():
        cls = ref(torch.tensor([ids])).last_hidden_state[0, 0]
    assert F.cosine_similarity(got, cls, dim=0).item() >= 0.9999
    with pytest.raises(ValueError, match="at most 128 tokens"):
        llm.embed({"prompt_token_ids": ids + ids[-1:]}, use_tqdm=False)
