"""LLM.embed / score / encode on sentence-transformers folders written here from tiny random
decoders, against sentence-transformers' own encode (float32, CPU): LAST, MEAN and CLS pooling
as each folder's 1_Pooling config says, Normalize present or not, Matryoshka dimensions,
chunked prefill (MEAN rows gathered across chunks) and the prefix cache (LAST only)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from support.deps import need

need("sentence_transformers")

from pagedkv import LLM  # noqa: E402
from pagedkv.engine.pooling_params import PoolingParams  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

TEXTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog, again and again and again.",
    "Paged attention keeps the KV cache in fixed-size blocks.",
    "a",
]
# name -> (preset, sentence-transformers pooling mode, Normalize module, config overrides)
CASES = {
    "last": ("tiny-llama", "lasttoken", True, dict(head_dim=32)),
    "mean": (
        "tiny-qwen2",  # q/k/v biases
        "mean",
        False,
        dict(num_attention_heads=2, num_key_value_heads=1, is_matryoshka=True),
    ),
    "cls": ("tiny-qwen3", "cls", True, {}),
}


def _st_folder(root: str, name: str) -> str:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    preset, mode, normalize, overrides = CASES[name]
    base = save_random_model(os.path.join(root, name + "-base"), preset, seed=5, **overrides)
    # sentence-transformers would wrap plain strings in the chat template.
    template = os.path.join(base, "chat_template.jinja")
    if os.path.exists(template):
        os.remove(template)
    body = Transformer(base)
    modules = [body, Pooling(body.get_embedding_dimension(), pooling_mode=mode)]
    if normalize:
        modules.append(Normalize())
    out = os.path.join(root, name)
    SentenceTransformer(modules=modules, device="cpu").save(out)
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    root = str(tmp_path_factory.mktemp("st_models"))
    return {name: _st_folder(root, name) for name in CASES}


def _llm(path: str, **kw) -> LLM:
    return LLM(path, device="cpu", kv_cache_space=0.02, max_model_len=128, **kw)


def _reference(path: str, texts, raw: bool = False, **kw) -> torch.Tensor:
    """sentence-transformers' embeddings; ``raw``: without the folder's Normalize module."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(path, device="cpu")
    if raw:
        st = SentenceTransformer(modules=[m for m in st if type(m).__name__ != "Normalize"])
    return st.encode(texts, convert_to_tensor=True, **kw).float()


def _embeddings(outs) -> torch.Tensor:
    return torch.tensor([o.outputs.embedding for o in outs])


def _assert_same(got: torch.Tensor, ref: torch.Tensor) -> None:
    assert got.shape == ref.shape
    cos = F.cosine_similarity(got, ref, dim=-1)
    assert cos.min().item() >= 0.9999, cos
    torch.testing.assert_close(got.norm(dim=-1), ref.norm(dim=-1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(CASES))
def test_embed_matches_sentence_transformers(folders, name: str) -> None:
    path = folders[name]
    llm = _llm(path)  # task "auto": a bare *Model checkpoint embeds
    assert llm.llm_engine.task == "embed"
    outs = llm.embed(TEXTS, use_tqdm=False)
    _assert_same(_embeddings(outs), _reference(path, TEXTS))
    assert [o.prompt_token_ids for o in outs] == [llm.get_tokenizer().encode(t) for t in TEXTS]
    # normalize on / off overrides the folder's Normalize module.
    for flag in (True, False):
        outs = llm.embed(TEXTS, pooling_params=PoolingParams(normalize=flag), use_tqdm=False)
        ref = _reference(path, TEXTS, raw=True, normalize_embeddings=flag)
        _assert_same(_embeddings(outs), ref)


def test_matryoshka_dimensions(folders) -> None:
    path = folders["mean"]
    llm = _llm(path)
    params = PoolingParams(dimensions=16, normalize=True)
    got = _embeddings(llm.embed(TEXTS, pooling_params=params, use_tqdm=False))
    ref = _reference(path, TEXTS, truncate_dim=16, normalize_embeddings=True)
    _assert_same(got, ref)
    with pytest.raises(ValueError, match="matryoshka"):
        _llm(folders["last"]).embed("x", pooling_params=PoolingParams(dimensions=16))


def test_mean_pooling_across_prefill_chunks(folders) -> None:
    path = folders["mean"]
    long_text = " ".join(TEXTS * 3)
    llm = _llm(path, max_num_batched_tokens=16)
    n = len(llm.get_tokenizer().encode(long_text))
    assert n > 40  # several chunks of at most 16 tokens
    got = _embeddings(llm.embed([long_text, TEXTS[0]], use_tqdm=False))
    _assert_same(got, _reference(path, [long_text, TEXTS[0]]))


def test_prefix_cache_only_for_last_token_pooling(folders) -> None:
    prompt = " ".join(TEXTS * 2)
    last = _llm(folders["last"])
    first = last.embed(prompt, use_tqdm=False)[0]
    again = last.embed(prompt, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0 and again.num_cached_tokens > 0
    _assert_same(_embeddings([again]), _embeddings([first]))
    mean = _llm(folders["mean"])
    mean.embed(prompt, use_tqdm=False)
    # MEAN reads every row: a cached prefix would have none, so it never hits.
    assert mean.embed(prompt, use_tqdm=False)[0].num_cached_tokens == 0
    eng = mean.llm_engine
    assert eng.scheduler.num_free_blocks == eng.num_gpu_blocks


def test_score_is_cosine_of_embeddings(folders) -> None:
    llm = _llm(folders["last"])
    outs = llm.score(TEXTS[0], TEXTS[1:], use_tqdm=False)
    ref = _reference(folders["last"], TEXTS)
    expected = F.cosine_similarity(ref[:1], ref[1:], dim=-1)
    got = torch.tensor([o.outputs.score for o in outs])
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_encode_returns_every_token(folders) -> None:
    from sentence_transformers import SentenceTransformer

    path = folders["last"]
    llm = _llm(path)
    out = llm.encode(TEXTS[1], pooling_task="encode", use_tqdm=False)[0]
    st = SentenceTransformer(path, device="cpu")
    ref = st.encode(TEXTS[1], output_value="token_embeddings", convert_to_tensor=True).float()
    assert out.outputs.data.shape == ref.shape
    torch.testing.assert_close(out.outputs.data, ref, rtol=1e-4, atol=1e-4)


def test_pooling_refusals(folders) -> None:
    llm = _llm(folders["last"])
    with pytest.raises(ValueError, match="generative model.*'embed'"):
        llm.generate("hi")
    with pytest.raises(ValueError, match="task .classify. is not served"):
        llm.classify("hi")
    with pytest.raises(ValueError, match="does not support \\['use_activation'\\]"):
        llm.embed("hi", pooling_params=PoolingParams(use_activation=True))
    with pytest.raises(ValueError, match="truncate_prompt_tokens"):
        llm.embed("hi " * 200)
    out = llm.embed("hi " * 200, truncate_prompt_tokens=5, use_tqdm=False)[0]
    assert len(out.prompt_token_ids) == 5
    with pytest.raises(ValueError, match="LLM.embed needs a pooling model"):
        LLM(device="cpu", kv_cache_space=0.02, max_model_len=64).embed("hi")


def test_causal_lm_config_over_bare_model_tensors(folders, tmp_path) -> None:
    """Qwen3-Embedding's layout: a *ForCausalLM config (tied head) over tensors saved without
    the "model." prefix, served with task="embed"."""
    import json
    import shutil

    path = str(tmp_path / "qwen3-embedding-like")
    shutil.copytree(folders["cls"], path)
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(architectures=["Qwen3ForCausalLM"], tie_word_embeddings=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    outs = _llm(path, task="embed").embed(TEXTS, use_tqdm=False)
    _assert_same(_embeddings(outs), _reference(folders["cls"], TEXTS))
