"""Draft-model speculative decoding through the whole engine (tiny random Llamas on the CPU).

The target is a 2-layer random Llama; the draft is that model cut to its first layer (a smaller
model with the same vocabulary whose guesses are often right: both accepted and rejected drafts
occur). Greedy speculation must produce exactly the plain greedy tokens (with output-dependent
knobs, stops inside the accepted drafts, prefix-cache hits, recompute and swap preemption) and
leak no block; sampled speculation must follow the target distribution, checked against
probabilities computed independently with Hugging Face transformers; a draft equal to the
target accepts every draft; a draft with another vocabulary is refused by name.
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
from pagedkv import LLM, SamplingParams
from support.deps import need
from support.engine import assert_no_leak
from support.peft_adapters import save_peft_adapter
from support.speculation import (
    CPU_TARGET_SHAPE,
    assert_samples_follow,
    hf_top_k_distribution,
    output_tokens,
    save_cpu_target,
    save_first_layers,
    spec_cpu_llm,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = CPU_TARGET_SHAPE["vocab_size"]
K = 3
PROMPTS = [
    [5, 6, 7, 8, 9] * 6 + [5, 6],
    list(range(10, 40)) + list(range(10, 20)),
    [128, 6] * 8 + [3, 4, 5],
    [200, 201, 202, 17, 18] * 4,
    [77],
]


def _save_target(root: Any, name: str, **over: Any) -> str:
    return save_cpu_target(str(root.mktemp(name)), **over)


@pytest.fixture(scope="module")
def target(tmp_path_factory: Any) -> str:
    return _save_target(tmp_path_factory, "draft_target")


@pytest.fixture(scope="module")
def draft(target: str, tmp_path_factory: Any) -> str:
    return save_first_layers(target, str(tmp_path_factory.mktemp("draft_small")), 1)


def _llm(model: str, draft: str | None = None, k: int = K, **kw: Any) -> LLM:
    if draft is not None:
        kw["speculative_config"] = {"model": draft, "num_speculative_tokens": k}
    return spec_cpu_llm(model, **kw)


def _tokens(llm: LLM, params: Any, prompts: List[List[int]] = PROMPTS) -> List[List[int]]:
    return output_tokens(llm, params, prompts)


def _greedy_params() -> List[SamplingParams]:
    return [
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True),
        # Output-dependent knobs: each draft position's row sees the drafts before it.
        SamplingParams(temperature=0.0, max_tokens=27, ignore_eos=True, repetition_penalty=1.3),
        # A stop id inside the accepted drafts ends the output there.
        SamplingParams(temperature=0.0, max_tokens=30, min_tokens=5, stop_token_ids=[6, 128]),
        SamplingParams(
            temperature=0.0, max_tokens=25, ignore_eos=True, frequency_penalty=0.4, min_tokens=3
        ),
        SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True),  # no room for drafts
    ]


def _stats(llm: LLM) -> Dict[str, Any]:
    return llm.llm_engine.get_stats()


@pytest.mark.parametrize("batched", [None, 16])
def test_greedy_with_a_draft_model_equals_plain_greedy(
    target: str, draft: str, batched: int | None
) -> None:
    """``batched`` 16: prompts in chunks, steps mixing prefill chunks with speculating
    decodes (the draft catches up on both in one forward)."""
    params = _greedy_params()
    want = _tokens(_llm(target), params)
    spec = _llm(target, draft, max_num_batched_tokens=batched)
    assert _tokens(spec, params) == want
    stats = _stats(spec)
    # The spec_decode_* counters: drafts proposed, some accepted and some rejected.
    assert stats["spec_decode_num_drafts"] > 0
    assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]
    assert_no_leak(spec)
    # Again on the same engine: the prompts' blocks now come from the prefix cache, where
    # the draft's cache (same block ids) holds what it wrote the first time.
    hits = stats["prefix_cache_hits"]
    assert _tokens(spec, params) == want
    assert _stats(spec)["prefix_cache_hits"] > hits
    assert_no_leak(spec)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_greedy_with_a_draft_model_under_preemption(target: str, draft: str, mode: str) -> None:
    """A KV cache too small for the batch: speculating sequences are preempted (their blocks
    recomputed, or swapped out and in with the draft's blocks) and resumed."""
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    want = _tokens(_llm(target), params)
    swap = {"num_cpu_blocks": 200} if mode == "swap" else {}
    small = _llm(target, draft, num_gpu_blocks_override=36, preemption_mode=mode, **swap)
    assert _tokens(small, params) == want
    stats = _stats(small)
    assert stats["num_preemptions"] > 0
    assert stats["spec_decode_num_accepted_tokens"] > 0
    assert_no_leak(small)


@pytest.mark.parametrize("mode", ["none", "recompute", "swap"])
def test_a_draft_equal_to_the_target_accepts_every_draft(target: str, mode: str) -> None:
    """The draft's cache follows the target's exactly (catch-up after prefills and accepted
    drafts, prefix-cache hits, preemption): the same model then agrees on every draft."""
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    want = _tokens(_llm(target), params)
    kw: Dict[str, Any] = {}
    if mode != "none":
        kw = dict(num_gpu_blocks_override=36, preemption_mode=mode)
        kw.update({"num_cpu_blocks": 200} if mode == "swap" else {})
    same = _llm(target, target, k=4, **kw)
    for _ in range(2):  # the second time from the prefix cache
        assert _tokens(same, params) == want
    stats = _stats(same)
    assert stats["spec_decode_num_draft_tokens"] > 0
    assert stats["spec_decode_num_accepted_tokens"] == stats["spec_decode_num_draft_tokens"]
    assert stats["prefix_cache_hits"] > 0
    assert (stats["num_preemptions"] > 0) == (mode != "none")
    assert_no_leak(same)


def test_sampling_with_a_draft_equal_to_the_target_accepts_almost_every_draft(
    target: str,
) -> None:
    """Temperature 1, no truncation: the draft's q is the target's p (up to kernel rounding),
    so min(1, p/q) accepts every draft; a verifier that ignored q (a point-mass draft) would
    accept only with probability p(x)."""
    params = [
        SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True, seed=s)
        for s in range(len(PROMPTS))
    ]
    same = _llm(target, target, k=4)
    _tokens(same, params)
    stats = _stats(same)
    assert stats["spec_decode_num_draft_tokens"] > 50
    assert stats["spec_decode_num_accepted_tokens"] >= 0.98 * stats["spec_decode_num_draft_tokens"]
    assert_no_leak(same)


@pytest.mark.parametrize("same", [False, True])
def test_top_k_1_samples_with_a_draft_model_equal_greedy(
    target: str, draft: str, same: bool
) -> None:
    """top_k 1 makes sampling deterministic (q and p are point masses): random-row speculation
    (draws from q, rejection sampling against it) must then give the greedy tokens, for each
    of n = 2 samples forked from one prompt (their blocks copied on write in both caches; a
    draft equal to the target then still agrees on every draft)."""
    greedy = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    top1 = [
        SamplingParams(n=2, temperature=0.8, top_k=1, max_tokens=30, ignore_eos=True, seed=s)
        for s in range(len(PROMPTS))
    ]
    spec = _llm(target, target if same else draft)
    outs = spec.generate([{"prompt_token_ids": p} for p in PROMPTS], top1, use_tqdm=False)
    want = _tokens(_llm(target), greedy)
    assert [[list(c.token_ids) for c in o.outputs] for o in outs] == [[w, w] for w in want]
    stats = _stats(spec)
    assert stats["spec_decode_num_accepted_tokens"] > 0
    if same:
        assert stats["spec_decode_num_accepted_tokens"] == stats["spec_decode_num_draft_tokens"]
    assert_no_leak(spec)


def test_sampled_speculation_with_a_draft_model_follows_the_target(target: str, draft: str) -> None:
    """Many seeds, top-k 3: the joint distribution of the first 3 tokens (the 2nd and 3rd
    drafted by the draft model from its own q and verified) against HF's exact one."""
    need("scipy.stats")
    prompt = PROMPTS[0]
    steps, top_k, n = 3, 3, 400
    exact = hf_top_k_distribution(target, prompt, steps, top_k)
    spec = _llm(target, draft, k=2, kv_cache_space=0.05)
    params = [
        SamplingParams(temperature=1.0, top_k=top_k, max_tokens=steps, seed=s, ignore_eos=True)
        for s in range(n)
    ]
    outs = spec.generate([{"prompt_token_ids": prompt}] * n, params, use_tqdm=False)
    assert_samples_follow([tuple(o.outputs[0].token_ids) for o in outs], exact)
    stats = _stats(spec)
    assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]
    assert_no_leak(spec)


def test_a_draft_with_another_vocabulary_is_refused_by_name(
    target: str, tmp_path_factory: Any
) -> None:
    other = _save_target(tmp_path_factory, "draft_other_vocab", vocab_size=VOCAB * 2)
    with pytest.raises(ValueError, match="vocab_size 512.*target model 256.*vocabulary"):
        _llm(target, other)


@pytest.mark.parametrize(
    ("config", "engine_args", "match"),
    [
        ({"prompt_lookup_max": 3}, {}, "prompt_lookup_max.*ngram"),
        ({"draft_tensor_parallel_size": 2}, {}, "draft_tensor_parallel_size"),
        ({"max_model_len": 64}, {}, "max_model_len"),
        ({"method": "eagle"}, {}, "eagle"),
        ({}, {"async_scheduling": True}, "async_scheduling"),
        ({}, {"tensor_parallel_size": 2}, "tensor or pipeline parallelism"),
    ],
)
def test_unsupported_draft_model_configs_are_refused_by_name(
    target: str, draft: str, config: Dict[str, Any], engine_args: Dict[str, Any], match: str
) -> None:
    spec = {"model": draft, "num_speculative_tokens": K, **config}
    with pytest.raises(ValueError, match=match):
        _llm(target, **engine_args, speculative_config=spec)


@pytest.mark.parametrize("name", ["yuhuili/EAGLE-LLaMA3-Instruct-8B", "x/medusa-vicuna-7b"])
def test_speculator_heads_named_as_vllm_infers_them_are_refused(target: str, name: str) -> None:
    """No 'method': vLLM infers EAGLE / Medusa from the draft's name; those heads are not
    draft models and are refused by name before anything is loaded."""
    spec = {"model": name, "num_speculative_tokens": K}
    with pytest.raises(ValueError, match="'(eagle|medusa)' is not supported"):
        _llm(target, speculative_config=spec)


def test_method_draft_model_needs_a_model(target: str) -> None:
    spec = {"method": "draft_model", "num_speculative_tokens": K}
    with pytest.raises(ValueError, match="'draft_model' needs 'model'"):
        _llm(target, speculative_config=spec)


def test_the_cache_budget_holds_both_models_blocks(target: str, draft: str) -> None:
    """One block id names a block of each model's cache: kv_cache_space is divided by the
    bytes of a block of both (target: 2 layers x 2 KV heads, draft: 1 x 2, head size 32,
    float32, block size 4)."""
    space = 0.01
    per_target = 2 * 2 * 4 * 2 * 32 * 4  # k and v, layers, block, heads, head size, bytes
    per_draft = 2 * 1 * 4 * 2 * 32 * 4
    spec = _llm(target, draft, kv_cache_space=space)
    assert spec.llm_engine.num_gpu_blocks == int(space * 2**30) // (per_target + per_draft)
    runner = spec.llm_engine.runner
    assert runner.draft.kv_caches[0].shape[1] == runner.kv_caches[0].shape[1]


def test_a_lora_target_with_a_draft_model_equals_its_plain_greedy(
    target: str, draft: str, tmp_path: Any
) -> None:
    """The target verifies with the request's adapter; the draft (no adapter) only proposes."""
    need("peft")
    need("transformers")
    from pagedkv import LoRARequest

    save_peft_adapter(target, str(tmp_path / "a1"), ["q_proj", "v_proj"], seed=1)
    lora = LoRARequest("a1", 1, str(tmp_path / "a1"))
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    inputs = [{"prompt_token_ids": p} for p in PROMPTS]
    kw: Dict[str, Any] = dict(enable_lora=True, max_lora_rank=4)
    want = _llm(target, **kw).generate(inputs, params, lora_request=lora, use_tqdm=False)
    spec = _llm(target, draft, **kw)
    got = spec.generate(inputs, params, lora_request=lora, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in got] == [
        list(o.outputs[0].token_ids) for o in want
    ]
    assert _tokens(_llm(target), params) != [list(o.outputs[0].token_ids) for o in want]
    assert _stats(spec)["spec_decode_num_accepted_tokens"] > 0
    assert_no_leak(spec)


def test_a_draft_model_for_an_image_model_is_refused_by_name(tmp_path: Any) -> None:
    """The draft reads token ids only: an image prompt would reach it without its image."""
    from pagedkv.testing import save_random_qwen2_vl

    path = save_random_qwen2_vl(str(tmp_path / "qwen2_vl"))
    spec = {"model": path, "num_speculative_tokens": K}
    with pytest.raises(ValueError, match="takes images.*use method 'ngram'"):
        LLM(path, device="cpu", kv_cache_space=0.02, speculative_config=spec)
