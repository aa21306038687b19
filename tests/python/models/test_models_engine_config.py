"""How the engine reads a checkpoint's configuration: generation_config.json defaults
(--generation-config auto | vllm | DIR), hf_overrides, rope_scaling / rope_theta overrides,
max_model_len derived with rope scaling, and refusals before any weight is read (head sizes the
kernels lack, classifiers)."""

from __future__ import annotations

import json
import logging
import os

import pytest
from support.deps import need

torch = need("torch")

from pagedkv import LLM, SamplingParams  # noqa: E402
from pagedkv.models import load_model  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

SHAPE = dict(vocab_size=256, head_dim=32, num_attention_heads=2, num_key_value_heads=1)


def _llm(path: str, **kw) -> LLM:
    return LLM(
        path, skip_tokenizer_init=True, device="cpu", **{"num_gpu_blocks_override": 64, **kw}
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = save_random_model(
        str(tmp_path_factory.mktemp("cfg")), "tiny-llama", seed=2, tokenizer=False, **SHAPE
    )
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump(
            {
                "temperature": 0.25,
                "top_p": 0.5,
                "top_k": 7,
                "max_new_tokens": 5,
                "eos_token_id": [2, 77],
                "do_sample": True,
            },
            f,
        )
    return path


def test_generation_config_auto_sets_defaults_and_eos(model_dir: str) -> None:
    llm = _llm(model_dir)
    p = llm.get_default_sampling_params()
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens) == (0.25, 0.5, 7, 5)
    assert 77 in llm.llm_engine.eos_token_ids
    out = llm.generate({"prompt_token_ids": [3, 4, 5]}, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 5 or out.finish_reason == "stop"


def test_generation_config_vllm_and_folder(model_dir: str, tmp_path) -> None:
    plain = _llm(model_dir, generation_config="vllm")
    assert plain.get_default_sampling_params().max_tokens == SamplingParams().max_tokens
    assert 77 not in plain.llm_engine.eos_token_ids
    with open(tmp_path / "generation_config.json", "w") as f:
        json.dump({"repetition_penalty": 1.3, "min_p": 0.1}, f)
    p = _llm(model_dir, generation_config=str(tmp_path)).get_default_sampling_params()
    assert (p.repetition_penalty, p.min_p, p.temperature) == (1.3, 0.1, 1.0)
    with pytest.raises(FileNotFoundError, match="no generation_config.json"):
        _llm(model_dir, generation_config=str(tmp_path / "absent"))


def test_hf_overrides_and_rope_overrides(model_dir: str) -> None:
    _, cfg = load_model(
        model_dir, torch.float32, "cpu", hf_overrides={"rope_theta": 5e5, "rms_norm_eps": 1e-3}
    )
    assert (cfg.rope_theta, cfg.rms_norm_eps) == (5e5, 1e-3)
    llm = _llm(model_dir, hf_overrides={"max_position_embeddings": 100})
    assert llm.llm_engine.model_config.max_model_len == 100
    llm = _llm(model_dir, rope_theta=1234.0, rope_scaling={"rope_type": "linear", "factor": 2.0})
    mc = llm.llm_engine.model_config.hf_config
    assert mc.rope_theta == 1234.0 and mc.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    with pytest.raises(TypeError, match="hf_overrides must be a dict"):
        _llm(model_dir, hf_overrides=lambda c: c)


def test_rope_overrides_change_the_model(model_dir: str, tmp_path) -> None:
    """rope_theta given as an override computes what a checkpoint saved with it computes."""
    other = save_random_model(
        str(tmp_path / "theta"), "tiny-llama", seed=2, tokenizer=False, rope_theta=1234.0, **SHAPE
    )
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=0, ignore_eos=True)
    prompt = {"prompt_token_ids": list(range(3, 40))}
    got = _llm(model_dir, rope_theta=1234.0).generate(prompt, params, use_tqdm=False)
    ref = _llm(other).generate(prompt, params, use_tqdm=False)
    base = _llm(model_dir).generate(prompt, params, use_tqdm=False)
    lp = [c.logprobs for c in (got[0].outputs[0], ref[0].outputs[0], base[0].outputs[0])]
    first = [next(iter(step.values())).logprob for step in lp[0]]
    assert first == [next(iter(step.values())).logprob for step in lp[1]]
    assert first != [next(iter(step.values())).logprob for step in lp[2]]


@pytest.mark.parametrize(
    "scaling,expected",
    [
        ({"rope_type": "linear", "factor": 2.0}, 512),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}, 256),
        (
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
            256,
        ),
    ],
)
def test_max_model_len_from_rope_scaling(tmp_path, scaling: dict, expected: int) -> None:
    path = save_random_model(
        str(tmp_path / "m"),
        "tiny-llama",
        tokenizer=False,
        max_position_embeddings=256,
        rope_scaling=scaling,
        **SHAPE,
    )
    llm = _llm(path, num_gpu_blocks_override=128)
    assert llm.llm_engine.model_config.max_model_len == expected
    # The rotary tables already cover the stretched context (a GPU never checks positions).
    rotary = llm.llm_engine.runner.model.model.rotary
    assert rotary._table_covers >= expected and rotary._cache_covers >= expected
    with pytest.raises(ValueError, match=f"context length {expected}"):
        _llm(path, max_model_len=expected + 1)


@pytest.mark.parametrize(
    "scaling,original,limit",
    [
        ({"rope_type": "dynamic", "factor": 3.0}, 256, 768),
        (
            {
                "rope_type": "longrope",
                "short_factor": [1.0] * 16,
                "long_factor": [2.0] * 16,
                "original_max_position_embeddings": 64,
            },
            64,
            256,
        ),
    ],
)
def test_batch_wide_rope_defaults_to_its_original_context(
    tmp_path, caplog, scaling: dict, original: int, limit: int
) -> None:
    """Past its original context a dynamic-NTK or LongRoPE rope switches factors for the whole
    batch (HF's and vLLM's rule): a request's output would depend on its batch-mates. So the
    default max_model_len stops there, with a warning naming the way further; asking for more
    is allowed (warned) up to the stretched length."""
    path = save_random_model(
        str(tmp_path / "m"),
        "tiny-llama",
        tokenizer=False,
        max_position_embeddings=256,
        rope_scaling=scaling,
        **SHAPE,
    )
    log = logging.getLogger("pagedkv")  # LLM stops it propagating: listen on it directly
    log.addHandler(caplog.handler)
    try:
        llm = _llm(path, num_gpu_blocks_override=128)
        assert llm.llm_engine.model_config.max_model_len == original
        assert "depend on its batch-mates" in caplog.text
        caplog.clear()
        llm = _llm(path, num_gpu_blocks_override=128, max_model_len=limit)
        assert llm.llm_engine.model_config.max_model_len == limit
        assert "depend on batch-mates" in caplog.text
    finally:
        log.removeHandler(caplog.handler)


def test_unsupported_head_size_refused_before_weights(tmp_path) -> None:
    path = save_random_model(
        str(tmp_path / "h16"), "tiny-llama", tokenizer=False, vocab_size=256, head_dim=16
    )
    os.remove(os.path.join(path, "model.safetensors"))  # never read: refused from config.json
    with pytest.raises(ValueError, match=r"head size 16.*supported head sizes: \[32, 64"):
        _llm(path)


def test_classifier_classifies_and_refuses_generation(tmp_path) -> None:
    path = save_random_model(
        str(tmp_path / "cls"),
        "tiny-llama",
        tokenizer=False,
        architectures=["LlamaForSequenceClassification"],
        num_labels=2,
        **SHAPE,
    )
    # task "auto" serves it with the pooling engine (LLM.classify: tests/python/engine/
    # test_pooling_classify.py); asked to generate, it is refused before any weight is read.
    assert _llm(path).llm_engine.task == "classify"
    with pytest.raises(ValueError, match="sequence-classification model"):
        _llm(path, task="generate")
