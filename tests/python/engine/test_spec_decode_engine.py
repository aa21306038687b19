"""N-gram speculative decoding through the whole engine (tiny random Llama on the CPU).

Greedy speculation must produce exactly the plain greedy tokens (with knobs that depend on the
output so far, stops inside the accepted drafts, and preemption under a small KV cache), and
leak no block; sampled speculation must follow the target distribution, checked against
probabilities computed independently with Hugging Face transformers.
"""

from __future__ import annotations

import itertools
from typing import Any, Dict, List

import pytest
from pagedkv import LLM, SamplingParams
from support.deps import need
from support.engine import assert_no_leak
from support.speculation import (
    assert_samples_follow,
    hf_top_k_distribution,
    output_tokens,
    save_cpu_target,
    spec_cpu_llm,
)

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
# Prompts that repeat themselves, so that n-gram lookup finds drafts (the random model's
# greedy continuations loop too).
PROMPTS = [
    [5, 6, 7, 8, 9] * 6 + [5, 6],
    list(range(10, 40)) + list(range(10, 20)),
    [128, 6] * 8 + [3, 4, 5],
    [200, 201, 202, 17, 18] * 4,
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: Any) -> str:
    return save_cpu_target(str(tmp_path_factory.mktemp("spec_engine")))


def _llm(model_dir: str, spec: Dict[str, Any] | None = None, **kw: Any) -> LLM:
    return spec_cpu_llm(model_dir, speculative_config=spec, **kw)


def _tokens(llm: LLM, params: Any) -> List[List[int]]:
    return output_tokens(llm, params, PROMPTS)


def _greedy_params() -> List[SamplingParams]:
    return [
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
        # A knob that changes with every accepted draft: each position's row sees the output
        # extended by the drafts before it.
        SamplingParams(temperature=0.0, max_tokens=33, ignore_eos=True, repetition_penalty=1.3),
        # min_tokens bans the stop ids early; a stop id inside the accepted drafts ends there.
        SamplingParams(temperature=0.0, max_tokens=30, min_tokens=5, stop_token_ids=[6, 128]),
        SamplingParams(
            temperature=0.0, max_tokens=37, ignore_eos=True, frequency_penalty=0.4, min_tokens=3
        ),
    ]


def test_greedy_speculation_equals_plain_greedy(model_dir: str) -> None:
    plain = _llm(model_dir)
    spec = _llm(model_dir, NGRAM)
    params = _greedy_params()
    assert _tokens(spec, params) == _tokens(plain, params)
    stats = spec.llm_engine.get_stats()
    # Drafts were proposed, some accepted and some rejected (both paths ran).
    assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]
    assert stats["spec_decode_num_drafts"] > 0
    assert_no_leak(spec)


def test_greedy_speculation_under_preemption(model_dir: str) -> None:
    """A KV cache too small for the batch: speculating sequences are preempted and resumed."""
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    want = _tokens(_llm(model_dir), params)
    small = _llm(model_dir, NGRAM, num_gpu_blocks_override=40)
    assert _tokens(small, params) == want
    stats = small.llm_engine.get_stats()
    assert stats["num_preemptions"] > 0
    assert stats["spec_decode_num_accepted_tokens"] > 0
    assert_no_leak(small)


def test_sampled_speculation_follows_the_target_distribution(model_dir: str) -> None:
    """Many seeds, top-k 3: the joint distribution of the first 3 tokens (the last 2
    verified by the rejection sampler when there are drafts) against HF's exact one."""
    need("scipy.stats")
    prompt = [5, 6, 7, 8, 9] * 6 + [5, 6] + [128, 6] * 4
    steps, top_k, n = 3, 3, 400
    exact = hf_top_k_distribution(model_dir, prompt, steps, top_k)
    spec = _llm(model_dir, {**NGRAM, "prompt_lookup_min": 1}, kv_cache_space=0.05)
    params = [
        SamplingParams(temperature=1.0, top_k=top_k, max_tokens=steps, seed=s, ignore_eos=True)
        for s in range(n)
    ]
    outs = spec.generate([{"prompt_token_ids": prompt}] * n, params, use_tqdm=False)
    assert_samples_follow([tuple(o.outputs[0].token_ids) for o in outs], exact)
    stats = spec.llm_engine.get_stats()
    assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]
    assert_no_leak(spec)


def test_sampled_speculation_with_a_penalty_and_temperature_follows_the_target(
    model_dir: str,
) -> None:
    """As above with knobs that change each verified row: a repetition penalty (it sees the
    output extended by the drafts before the row) and a temperature. The penalty is below 1 so
    that repeats, which n-gram lookup drafts, stay likely."""
    need("scipy.stats")
    prompt = [5, 6, 7, 8, 9] * 6 + [5, 6] + [128, 6] * 4
    steps, top_k, n, penalty, temperature = 3, 3, 400, 0.7, 0.8
    exact = hf_top_k_distribution(model_dir, prompt, steps, top_k, temperature, penalty)
    spec = _llm(model_dir, {**NGRAM, "prompt_lookup_min": 1}, kv_cache_space=0.05)
    params = [
        SamplingParams(
            temperature=temperature,
            top_k=top_k,
            repetition_penalty=penalty,
            max_tokens=steps,
            seed=s,
            ignore_eos=True,
        )
        for s in range(n)
    ]
    outs = spec.generate([{"prompt_token_ids": prompt}] * n, params, use_tqdm=False)
    assert_samples_follow([tuple(o.outputs[0].token_ids) for o in outs], exact)
    stats = spec.llm_engine.get_stats()
    assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]
    assert_no_leak(spec)


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({**NGRAM, "revision": "main"}, "draft model's key"),
        ({"method": "eagle", "num_speculative_tokens": 3, "prompt_lookup_max": 3}, "eagle"),
        ({**NGRAM, "acceptance_method": "typical"}, "acceptance_method"),
        ({**NGRAM, "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 2}, "prompt_lookup_max"),
        ({**NGRAM, "prompt_lookup_min": 5}, "prompt_lookup_min"),
        ({**NGRAM, "async_scheduling": True}, "async_scheduling"),
        ({**NGRAM, "task": "embed"}, "pooling"),
    ],
)
def test_unsupported_speculative_configs_are_refused_by_name(
    model_dir: str, config: Dict[str, Any], match: str
) -> None:
    config = dict(config)
    engine_args = {k: config.pop(k) for k in ("async_scheduling", "task") if k in config}
    with pytest.raises(ValueError, match=match):
        _llm(model_dir, config, **engine_args)


def test_every_emitted_token_is_one_the_plain_sampler_could_draw(model_dir: str) -> None:
    """top_k 1 makes sampling deterministic: speculative sampling must then equal greedy."""
    greedy = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    top1 = [
        SamplingParams(temperature=0.8, top_k=1, max_tokens=30, ignore_eos=True, seed=s)
        for s, _ in zip(itertools.count(), PROMPTS)
    ]
    assert _tokens(_llm(model_dir, NGRAM), top1) == _tokens(_llm(model_dir), greedy)


def test_a_stop_string_inside_the_accepted_drafts_ends_the_output_there(
    tmp_path_factory: Any,
) -> None:
    """A speculative step appends several tokens at once; a stop string found in the first of
    them ends the sample there: text and token ids as plain decoding gives them."""
    path = save_cpu_target(str(tmp_path_factory.mktemp("spec_stop")), tokenizer=True)
    kw: Dict[str, Any] = dict(device="cpu", kv_cache_space=0.02, max_model_len=256)
    prompt = "one two three four one two three four one two three four one two"
    plain = LLM(path, **kw)
    # Greedy over a few word tokens: a random model's output then cycles, so drafts hit.
    words = plain.get_tokenizer().encode(" one two three four five six seven eight")
    knobs: Dict[str, Any] = dict(temperature=0.0, max_tokens=40, allowed_token_ids=words)
    full = plain.generate(prompt, SamplingParams(**knobs), use_tqdm=False)[0].outputs[0]
    # A stop string of several output tokens: once the output cycles, the step that completes
    # it has accepted drafts past it.
    stop = plain.get_tokenizer().decode(list(full.token_ids[10:21]))
    assert stop.strip() and full.text.find(stop) > 0, (full.text, stop)
    params = SamplingParams(**knobs, stop=[stop])
    want = plain.generate(prompt, params, use_tqdm=False)[0].outputs[0]
    spec = LLM(path, **kw, speculative_config={**NGRAM, "prompt_lookup_min": 1})
    got = spec.generate(prompt, params, use_tqdm=False)[0].outputs[0]
    assert (got.text, list(got.token_ids), got.finish_reason) == (
        want.text,
        list(want.token_ids),
        want.finish_reason,
    )
    assert spec.llm_engine.get_stats()["spec_decode_num_accepted_tokens"] > 0
    assert_no_leak(spec)


@pytest.mark.slow
def test_greedy_speculation_on_the_default_model_equals_plain_greedy() -> None:
    """SmolLM2 on an input-grounded prompt (repeat a text): many drafts accepted, same text."""
    text = (
        "The block allocator hands out fixed-size blocks of key and value cache to sequences; "
        "finished sequences give their blocks back."
    )
    prompt = f"Repeat the following text exactly.\n\nText: {text}\n\nRepeated text:"
    params = SamplingParams(temperature=0.0, max_tokens=24)
    kw: Dict[str, Any] = dict(device="cpu", kv_cache_space=0.05, max_model_len=256)
    want = LLM(**kw).generate(prompt, params, use_tqdm=False)[0].outputs[0]
    spec = LLM(**kw, speculative_config={**NGRAM, "prompt_lookup_min": 2})
    got = spec.generate(prompt, params, use_tqdm=False)[0].outputs[0]
    assert list(got.token_ids) == list(want.token_ids)
    stats = spec.llm_engine.get_stats()
    assert stats["spec_decode_num_accepted_tokens"] >= 8, stats
    assert_no_leak(spec)
