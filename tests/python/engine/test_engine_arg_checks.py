"""Engine and request arguments: what vLLM accepts is accepted, what cannot work raises
ValueError / TypeError naming the argument when it is given, never later inside a step.

(Before: LLM(trust_remote_code=True) raised TypeError; LLM(seed=None) failed in
torch.manual_seed; block_size="16" said "must be a power of two <= 256, got 16"; swap_space=-1
and SamplingParams(detokenize=False, stop=[...]) were accepted, the stop strings ignored;
seed=2**70 failed inside generate with "Overflow when unpacking long long"; priority=2**31 gave
a nanobind TypeError dump and priority=5 under fcfs was silently ignored.)
"""

from __future__ import annotations

import pytest
from support.deps import need
from support.engine import assert_no_leak

need("torch")

from pagedkv.engine.config import EngineConfig  # noqa: E402
from pagedkv.engine.sampling_params import SamplingParams  # noqa: E402


# ------------------------------------------------------------------ EngineConfig (no model)
def test_vllm_arguments_that_change_nothing_are_accepted():
    cfg = EngineConfig.from_kwargs(
        trust_remote_code=True,
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        disable_log_stats=True,
    )
    assert cfg.trust_remote_code and cfg.tensor_parallel_size == 1
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        assert EngineConfig.from_kwargs(**{name: 2}).world_size == 2
        with pytest.raises(ValueError, match=rf"^{name} must be >= 1, got 0"):
            EngineConfig.from_kwargs(**{name: 0})
    with pytest.raises(TypeError, match="unexpected engine argument"):
        EngineConfig.from_kwargs(tensor_paralel_size=1)


def test_seed_none_is_zero_as_in_vllm():
    assert EngineConfig.from_kwargs(seed=None).seed == 0
    assert EngineConfig.from_kwargs(seed=2**63 - 1).seed == 2**63 - 1
    for bad in (2**63, -(2**63) - 1, 2**70):
        with pytest.raises(ValueError, match=r"^seed must be in"):
            EngineConfig.from_kwargs(seed=bad)


BAD_TYPES = [
    ("block_size", "16", "an int"),
    ("block_size", 16.0, "an int"),
    ("max_num_seqs", "4", "an int"),
    ("max_model_len", "128", "an int or None"),
    ("seed", 1.5, "an int or None"),
    ("swap_space", "4", "a number"),
    ("kv_cache_space", "1", "a number"),
    ("enforce_eager", "yes", "True or False"),
    ("trust_remote_code", 1, "True or False"),
]


@pytest.mark.parametrize("name,value,kind", BAD_TYPES, ids=[f"{n}-{v!r}" for n, v, _ in BAD_TYPES])
def test_engine_argument_types_name_the_argument(name, value, kind):
    with pytest.raises(TypeError, match=rf"^{name} must be {kind}, got {type(value).__name__}"):
        EngineConfig.from_kwargs(**{name: value})


def test_engine_argument_values():
    np = need("numpy")
    assert EngineConfig.from_kwargs(block_size=np.int64(32), swap_space=0).block_size == 32
    with pytest.raises(ValueError, match=r"^swap_space must be >= 0 GiB, got -1"):
        EngineConfig.from_kwargs(swap_space=-1)
    with pytest.raises(ValueError, match=r"^block_size must be a power of two <= 256, got 24"):
        EngineConfig.from_kwargs(block_size=24)
    with pytest.raises(ValueError, match=r"^max_logprobs must be -1"):
        EngineConfig.from_kwargs(max_logprobs=-5)


# ------------------------------------------------------------------ SamplingParams
def test_stop_strings_need_detokenize():
    with pytest.raises(ValueError, match=r"^stop strings are only supported when detokenize"):
        SamplingParams(detokenize=False, stop=["x"])
    with pytest.raises(ValueError, match="detokenize"):
        SamplingParams(detokenize=False, stop="x")
    assert SamplingParams(detokenize=False, stop_token_ids=[5]).stop == []
    assert SamplingParams(detokenize=False, stop=[]).detokenize is False


def test_sampling_seed_bounds():
    assert SamplingParams(seed=2**63 - 1).seed == 2**63 - 1
    assert SamplingParams(seed=-(2**63)).seed == -(2**63)
    for bad in (2**63, 2**70, -(2**63) - 1):
        with pytest.raises(ValueError, match=r"^seed must be in \[-2\*\*63, 2\*\*63 - 1\]"):
            SamplingParams(seed=bad)


# ------------------------------------------------------------------ with the model
@pytest.fixture(scope="module")
def llm(smollm2_gguf: str):
    need("gguf")
    from pagedkv.engine.llm import LLM

    return LLM(device="cpu", kv_cache_space=0.05, max_model_len=128)


@pytest.mark.slow
def test_llm_takes_vllm_style_arguments(llm):
    from pagedkv.engine.llm import LLM

    # What vLLM example code passes; seed=None is vLLM's newer default.
    other = LLM(
        device="cpu",
        kv_cache_space=0.05,
        max_model_len=128,
        seed=None,
        trust_remote_code=True,
        tensor_parallel_size=1,
    )
    p = SamplingParams(temperature=0, max_tokens=4)
    assert (
        other.generate("Hi", p, use_tqdm=False)[0].outputs[0].token_ids
        == llm.generate("Hi", p, use_tqdm=False)[0].outputs[0].token_ids
    )
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1"):
        LLM(device="cpu", tensor_parallel_size=0)


@pytest.mark.slow
def test_extreme_seeds_generate(llm):
    for seed in (2**63 - 1, -(2**63)):
        outs = llm.generate(
            "Hi", SamplingParams(n=2, temperature=1.0, seed=seed, max_tokens=3), use_tqdm=False
        )
        assert [len(c.token_ids) for c in outs[0].outputs] == [3, 3]
    assert_no_leak(llm)


@pytest.mark.slow
def test_priority_checks(llm):
    p = SamplingParams(max_tokens=1)
    eng = llm.llm_engine
    for bad in (2**31, -(2**31) - 1):
        with pytest.raises(ValueError, match=r"^priority must be in \[-2\*\*31, 2\*\*31 - 1\]"):
            llm.generate(["a", "b"], p, priority=[0, bad], use_tqdm=False)
        with pytest.raises(ValueError, match="priority"):  # ValueError: the server's 400
            eng.add_request("r", "a", p, priority=bad)
    with pytest.raises(
        ValueError,
        match=r"^Got priority 5 but Priority scheduling is not "
        r"enabled\.",
    ):
        llm.generate(["a"], p, priority=[5], use_tqdm=False)
    with pytest.raises(TypeError, match=r"^priority must be an integer"):
        eng.add_request("r", "a", p, priority=1.5)
    assert not eng.requests
    assert_no_leak(llm)
    assert len(llm.generate(["a", "b"], p, priority=[0, 0], use_tqdm=False)) == 2


@pytest.mark.slow
def test_priority_policy_takes_the_int32_range(llm):
    from pagedkv.engine.llm import LLM

    prio = LLM(device="cpu", kv_cache_space=0.05, max_model_len=128, scheduling_policy="priority")
    outs = prio.generate(
        ["a", "b", "c"],
        SamplingParams(max_tokens=2),
        priority=[2**31 - 1, -(2**31), 5],
        use_tqdm=False,
    )
    assert [len(o.outputs[0].token_ids) for o in outs] == [2, 2, 2]
    with pytest.raises(ValueError, match="priority"):
        prio.generate(["a"], SamplingParams(max_tokens=2), priority=[2**31], use_tqdm=False)
    assert_no_leak(prio)
