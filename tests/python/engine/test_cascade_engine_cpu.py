"""The engine's cascade decode on the CPU: requests on one cached system prompt (the prefix cache
shares its blocks) with user turns of different lengths give the same greedy tokens and
log-probabilities with the cascade on (the default) and off (disable_cascade_attn=True), for
several block sizes and an fp8 cache; the cascade ran on the decode steps and every block came
back."""

from __future__ import annotations

import numpy as np
import pytest
from support.deps import need
from support.engine import assert_no_leak

torch = need("torch")

from pagedkv import LLM, SamplingParams  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return save_random_model(
        str(tmp_path_factory.mktemp("tiny_cascade")),
        "tiny-llama",
        seed=7,
        tokenizer=False,
        head_dim=32,
        vocab_size=512,
        max_position_embeddings=1024,
    )


def _llm(model_dir: str, block_size: int, disable: bool, **kw) -> LLM:
    return LLM(
        model_dir,
        device="cpu",
        skip_tokenizer_init=True,
        block_size=block_size,
        max_model_len=512,
        kv_cache_space=0.05,
        disable_cascade_attn=disable,
        **kw,
    )


def _run(model_dir: str, prompts: list, block_size: int, disable: bool, kv_dtype: str):
    llm = _llm(model_dir, block_size, disable, kv_cache_dtype=kv_dtype)
    llm.generate([prompts[0]], SamplingParams(max_tokens=1), use_tqdm=False)  # cache the prompt
    params = [
        SamplingParams(temperature=0, max_tokens=4 + i, ignore_eos=True, logprobs=2)
        for i in range(len(prompts))
    ]
    outs = llm.generate(prompts, params, use_tqdm=False)
    plans = llm.llm_engine.runner.step_plans
    assert_no_leak(llm)
    return outs, (0 if plans is None else plans.cascade_layers)


@pytest.mark.parametrize("block_size, kv_dtype", [(8, "auto"), (16, "auto"), (16, "fp8")])
def test_cascade_on_off_same_outputs(model_dir: str, block_size: int, kv_dtype: str) -> None:
    rng = np.random.default_rng(block_size)
    system = rng.integers(3, 500, 300).tolist()
    # Suffix lengths 1..17 and 9 requests: some end their prompt inside a block, others
    # across one; they stop at different steps (the plans refill for fewer rows, and below the
    # rule's 4 rows the plain decode takes over).
    prompts = [system + rng.integers(3, 500, n).tolist() for n in (1, 5, 17, 2, 9, 13, 3, 8, 16)]
    on, on_layers = _run(model_dir, prompts, block_size, False, kv_dtype)
    off, off_layers = _run(model_dir, prompts, block_size, True, kv_dtype)
    assert on_layers > 0 and off_layers == 0
    for a, b in zip(on, off):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for la, lb in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            for tid, lp in la.items():
                assert abs(lp.logprob - lb[tid].logprob) < 1e-4


def test_parallel_samples_share_the_prompt_without_the_prefix_cache(model_dir: str) -> None:
    """n = 5 samples of one 300-token prompt share its blocks by forking (no prefix cache): the
    decode steps run the cascade; seeded samples give the tokens and log-probabilities of the
    engine without it."""
    prompt = np.random.default_rng(1).integers(3, 500, 300).tolist()
    params = SamplingParams(n=5, temperature=0.8, seed=11, max_tokens=6, logprobs=1)
    runs = {}
    for disable in (False, True):
        llm = _llm(model_dir, 16, disable, enable_prefix_caching=False)
        runs[disable] = llm.generate([prompt], params, use_tqdm=False)[0].outputs
        plans = llm.llm_engine.runner.step_plans
        assert (plans is not None and plans.cascade_layers > 0) == (not disable)
        assert_no_leak(llm)
    for a, b in zip(runs[False], runs[True]):
        assert a.token_ids == b.token_ids
        for la, lb in zip(a.logprobs, b.logprobs):
            for tid, lp in la.items():
                assert abs(lp.logprob - lb[tid].logprob) < 1e-4


def test_cascade_cuda_graphs_needs_the_cascade_and_graphs() -> None:
    from pagedkv.engine.config import EngineConfig

    for bad in ({"disable_cascade_attn": True}, {"enforce_eager": True}):
        with pytest.raises(ValueError, match="cascade_cuda_graphs=True"):
            EngineConfig.from_kwargs(cascade_cuda_graphs=True, **bad)
    EngineConfig.from_kwargs(cascade_cuda_graphs=True)
