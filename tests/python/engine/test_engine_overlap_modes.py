"""async_scheduling's default (None: overlapped wherever supported, serial where a feature
needs it) and the cases test_engine_overlap.py leaves out, each run serially and overlapped on a
tiny random Llama (CPU, float32) with every token, logprob and finish compared: sampling with
penalties, top-k / top-p / min-p and seeds, logit bias and allowed tokens, prefix-cache hits; and an
AsyncLLMEngine request aborted while its step is in flight frees its blocks.

The rest of the engine suite proves the same at large: it runs overlapped by default, and
``pytest --serial-loop`` runs it again on the serial loop (tests/python/conftest.py)."""

from __future__ import annotations

import argparse
import asyncio

import numpy as np
import pytest
from support.deps import need
from support.engine import assert_no_leak
from support.server import tiny_async_engine, wait_engine_idle

torch = need("torch")

from pagedkv import LLM, SamplingParams  # noqa: E402
from pagedkv.engine.config import EngineConfig  # noqa: E402
from pagedkv.entrypoints.engine_args import add_engine_arguments  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 256
NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("tiny_overlap_modes"))
    return save_random_model(
        out, "tiny-llama", seed=11, tokenizer=False, head_dim=32, vocab_size=VOCAB
    )


def _llm(path: str, overlap: bool, **kw) -> LLM:
    kw = {"block_size": 4, "num_gpu_blocks_override": 96, "max_model_len": 96, **kw}
    return LLM(
        path,
        device="cpu",
        dtype="float32",
        skip_tokenizer_init=True,
        async_scheduling=overlap,
        **kw,
    )


def _prompts(n: int, seed: int, lo: int = 4, hi: int = 24) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, int(rng.integers(lo, hi))).tolist() for _ in range(n)]


def _run(llm: LLM, prompts, params) -> list:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert_no_leak(llm)
    return [
        [
            (
                c.token_ids,
                c.finish_reason,
                [
                    sorted((t, round(lp.logprob, 4)) for t, lp in d.items())
                    for d in c.logprobs or []
                ],
            )
            for c in o.outputs
        ]
        for o in outs
    ]


def _both(path: str, prompts, params, **kw) -> list:
    serial = _llm(path, False, **kw)
    overlapped = _llm(path, True, **kw)
    assert (
        overlapped.llm_engine.core.async_scheduling and not serial.llm_engine.core.async_scheduling
    )
    out = _run(serial, prompts, params)
    assert _run(overlapped, prompts, params) == out
    return out


# ------------------------------------------------------------------------------ the default
def test_auto_overlaps_a_generation_engine(request) -> None:
    if request.config.getoption("--serial-loop"):
        pytest.skip("--serial-loop replaces the rule under test")
    assert EngineConfig().overlapped_steps
    assert not EngineConfig(async_scheduling=False).overlapped_steps
    # TP / PP: overlap when asked (not by default until it has run on GPUs).
    assert not EngineConfig(tensor_parallel_size=2, pipeline_parallel_size=2).overlapped_steps
    assert EngineConfig(tensor_parallel_size=2, async_scheduling=True).overlapped_steps
    # A feature that needs the serial loop: auto picks it silently, an explicit True is
    # refused by name.
    assert not EngineConfig.from_kwargs(speculative_config=NGRAM).overlapped_steps
    with pytest.raises(ValueError, match="async_scheduling with speculative_config"):
        EngineConfig.from_kwargs(speculative_config=NGRAM, async_scheduling=True)
    with pytest.raises(TypeError, match="async_scheduling must be True or False or None"):
        EngineConfig.from_kwargs(async_scheduling="yes")


def test_engines_pick_their_loop(model_dir: str, request) -> None:
    serial_suite = request.config.getoption("--serial-loop")
    llm = LLM(model_dir, device="cpu", skip_tokenizer_init=True, kv_cache_space=0.01)
    assert llm.llm_engine.core.async_scheduling is not serial_suite
    spec = LLM(
        model_dir,
        device="cpu",
        skip_tokenizer_init=True,
        kv_cache_space=0.01,
        speculative_config=NGRAM,
    )
    assert not spec.llm_engine.core.async_scheduling


def test_cli_flag_is_vllms_spelling() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert parser.parse_args([]).async_scheduling is None
    assert parser.parse_args(["--async-scheduling"]).async_scheduling is True
    assert parser.parse_args(["--no-async-scheduling"]).async_scheduling is False


# ------------------------------------------------------------------------------ exactness
def test_penalties_and_truncated_sampling_with_seeds(model_dir: str) -> None:
    # Penalties read every earlier token of the sample: overlapped, step N's token must be in
    # the output before step N+1 is sampled.
    prompts = _prompts(6, 1)
    kinds = [
        dict(presence_penalty=1.5, frequency_penalty=0.5),
        dict(repetition_penalty=1.8),
        dict(top_k=8, min_p=0.05),
        dict(top_p=0.7, presence_penalty=-0.5),
        dict(top_k=20, top_p=0.9, repetition_penalty=1.2, frequency_penalty=1.0),
        dict(min_p=0.2),
    ]
    params = [
        SamplingParams(
            temperature=0.9, seed=100 + i, max_tokens=14, ignore_eos=True, logprobs=2, **kind
        )
        for i, kind in enumerate(kinds)
    ]
    out = _both(model_dir, prompts, params)
    assert len({tuple(o[0][0]) for o in out}) == len(out)


def test_logit_bias_and_allowed_tokens(model_dir: str) -> None:
    prompts = _prompts(4, 2)
    free = _run(_llm(model_dir, False), prompts, SamplingParams(temperature=0, max_tokens=10))
    chosen = sorted({o[0][0][2] for o in free})  # tokens the free outputs chose at step 3
    allowed = [t for t in range(3, 40) if t not in chosen]
    greedy = dict(temperature=0, max_tokens=10, ignore_eos=True)
    params = [
        SamplingParams(**greedy, logit_bias={chosen[0]: -100}),
        SamplingParams(**greedy, allowed_token_ids=allowed),
        SamplingParams(**greedy, logit_bias={7: 30.0}),
        SamplingParams(**greedy),
    ]
    out = _both(model_dir, prompts, params)
    assert set(out[1][0][0]) <= set(allowed)
    assert out[2][0][0] == [7] * 10


def test_prefix_cache_hits(model_dir: str) -> None:
    # Later requests share the first ones' prompts: their prefill starts from cached blocks,
    # including blocks completed by decode tokens of a step still in flight.
    base = _prompts(3, 3, 12, 20)
    prompts = base + [p + [5, 6, 7, 8] for p in base] + base
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)
    llms = [_llm(model_dir, ov, max_num_seqs=3) for ov in (False, True)]
    outs = [_run(llm, prompts, params) for llm in llms]
    assert outs[0] == outs[1]
    for llm in llms:
        assert llm.llm_engine.get_stats()["prefix_cache_hits"] > 0


# ------------------------------------------------------------------------------ server
def test_async_engine_abort_in_flight_frees_blocks(tmp_path_factory) -> None:
    engine = tiny_async_engine(
        tmp_path_factory, "overlap_abort", seed=4, max_model_len=128, async_scheduling=True
    )
    try:

        async def go() -> int:
            params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
            seen = 0
            async for out in engine.generate({"prompt_token_ids": [5, 6, 7, 8]}, params, "a"):
                seen = len(out.outputs[0].token_ids)
                if seen >= 3:  # mid-flight: a step is launched and not yet applied
                    engine.abort("a")
                    break
            return seen

        assert asyncio.run(go()) >= 3
        wait_engine_idle(engine)

        # The engine still serves: a request after the abort runs to its end.
        async def after() -> int:
            params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
            final = None
            async for out in engine.generate({"prompt_token_ids": [9, 10]}, params, "b"):
                final = out
            assert final is not None and final.finished
            return len(final.outputs[0].token_ids)

        assert asyncio.run(after()) == 5
        wait_engine_idle(engine)
    finally:
        engine.shutdown()
