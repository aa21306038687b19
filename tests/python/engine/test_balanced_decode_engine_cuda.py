"""The engine's balanced decode on a CUDA GPU (Hopper): eager decode steps of a skewed batch (one
long prompt among short ones) run on the balanced plan ("auto"), and give the tokens and
log-probabilities of the partition split."""

from __future__ import annotations

import numpy as np
import pytest
from support.deps import need
from support.engine import assert_no_leak

torch = need("torch")

from pagedkv.engine.llm import LLM  # noqa: E402
from pagedkv.engine.sampling_params import SamplingParams  # noqa: E402

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from pagedkv.testing import save_random_model

    return save_random_model(
        str(tmp_path_factory.mktemp("tiny_llama_balanced")),
        "tiny-llama",
        tokenizer=False,
        hidden_size=256,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=512,
        num_hidden_layers=3,
        vocab_size=2048,
        max_position_embeddings=4096,
    )


def test_skewed_eager_decode_runs_balanced_and_matches_partition(model_dir):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the balanced decode runs on the Hopper decode")
    rng = np.random.default_rng(3)
    prompts = [rng.integers(5, 2000, n).tolist() for n in (3000, 7, 12, 5, 20, 9, 15, 4)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3)
    runs = {}
    for schedule in ("auto", "partition"):
        llm = LLM(
            model_dir,
            skip_tokenizer_init=True,
            seed=0,
            device="cuda",
            dtype="bfloat16",
            enforce_eager=True,
            max_model_len=4096,
            num_gpu_blocks_override=1024,
        )
        plans = llm.llm_engine.runner.step_plans
        assert plans is not None, "the Hopper decode has balanced plans"
        plans.schedule = schedule
        runs[schedule] = llm.generate(prompts, params, use_tqdm=False)
        assert (plans.balanced_layers > 0) == (schedule == "auto"), plans.balanced_layers
        assert_no_leak(llm)
    a, b = runs["auto"], runs["partition"]
    toks = [
        (x, y)
        for oa, ob in zip(a, b)
        for x, y in zip(oa.outputs[0].token_ids, ob.outputs[0].token_ids)
    ]
    assert np.mean([x == y for x, y in toks]) > 0.9  # bf16: only near-ties may flip
    for oa, ob in zip(a, b):
        ta, tb = oa.outputs[0].token_ids, ob.outputs[0].token_ids
        # Decode steps (token 1 on) whose inputs agree: the same distribution up to bf16.
        for i in range(1, len(ta)):
            if ta[:i] != tb[:i]:
                break
            la, lb = oa.outputs[0].logprobs[i], ob.outputs[0].logprobs[i]
            for tid in set(la) & set(lb):
                assert abs(la[tid].logprob - lb[tid].logprob) < 0.05, (i, tid)


@pytest.mark.parametrize("eager", [True, False])
def test_shared_prompt_decode_runs_the_cascade(model_dir, eager):
    """Requests on one cached system prompt (the prefix cache shares its blocks): decode steps
    run the cascade, eager or as the cascade variant of the CUDA graphs, and give the tokens of
    the engine without it (disable_cascade_attn=True)."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the cascade runs on the Hopper decode")
    rng = np.random.default_rng(4)
    system = rng.integers(5, 2000, 1024).tolist()
    prompts = [system + rng.integers(5, 2000, n).tolist() for n in (5, 1, 17, 30, 2, 9, 12, 3)]
    params = [SamplingParams(temperature=0, max_tokens=4 + i, ignore_eos=True) for i in range(8)]
    runs = {}
    for disable in (False, True):
        llm = LLM(
            model_dir,
            skip_tokenizer_init=True,
            seed=0,
            device="cuda",
            dtype="bfloat16",
            enforce_eager=eager,
            max_model_len=2048,
            max_num_seqs=16,
            num_gpu_blocks_override=1024,
            disable_cascade_attn=disable,
            cascade_cuda_graphs=not eager and not disable,
        )
        runner = llm.llm_engine.runner
        llm.generate([prompts[0]], SamplingParams(max_tokens=1), use_tqdm=False)  # cache it
        runs[disable] = llm.generate(prompts, params, use_tqdm=False)
        if eager:
            ran = runner.step_plans.cascade_layers
        else:
            ran = runner.graphs.cascade_replays
            assert runner.step_plans.cascade_layers == 0  # every decode step a graph replay
        assert (ran > 0) == (not disable), ran
        assert_no_leak(llm)
        del llm, runner
    toks = [
        (x, y)
        for oa, ob in zip(runs[False], runs[True])
        for x, y in zip(oa.outputs[0].token_ids, ob.outputs[0].token_ids)
    ]
    assert np.mean([x == y for x, y in toks]) > 0.9  # bf16: only near-ties may flip
