"""Overlapped scheduling on a CUDA GPU: CUDA-graph decode with placeholder inputs filled in on
the device, tokens copied back through pinned memory while the next step runs. Same tokens,
finish reasons and stop reasons as the serial loop (float32, so no near-tie can flip)."""

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

    out = str(tmp_path_factory.mktemp("tiny_llama_overlap"))
    return save_random_model(
        out,
        "tiny-llama",
        tokenizer=False,
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=512,
        num_hidden_layers=4,
        vocab_size=2048,
        max_position_embeddings=1024,
    )


def _run(model_dir: str, overlap: bool, prompts, params, **kw) -> list:
    kw = {"num_gpu_blocks_override": 512, "max_model_len": 512, "max_num_seqs": 16, **kw}
    llm = LLM(
        model_dir,
        skip_tokenizer_init=True,
        seed=0,
        device="cuda",
        dtype="float32",
        async_scheduling=overlap,
        **kw,
    )
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert_no_leak(llm)
    if not kw.get("enforce_eager"):
        assert llm.llm_engine.runner.graphs.num_replays > 0
    return [(c.token_ids, c.finish_reason, c.stop_reason) for o in outs for c in o.outputs]


def _prompts(n: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [
        {"prompt_token_ids": rng.integers(5, 2000, int(rng.integers(3, 60))).tolist()}
        for _ in range(n)
    ]


@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
def test_overlap_matches_serial_on_cuda(model_dir: str, eager: bool) -> None:
    prompts = _prompts(12)
    free = _run(
        model_dir,
        False,
        prompts,
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
        enforce_eager=eager,
    )
    stops = sorted({toks[5 + i % 7] for i, (toks, _, _) in enumerate(free)})[:4]
    params = [
        SamplingParams(temperature=0, max_tokens=8 + 2 * i, ignore_eos=True, stop_token_ids=stops)
        for i in range(len(prompts))
    ]
    serial = _run(model_dir, False, prompts, params, enforce_eager=eager)
    assert _run(model_dir, True, prompts, params, enforce_eager=eager) == serial
    assert {r for _, r, _ in serial} == {"stop", "length"}


def test_overlap_with_preemption_and_seeded_forks_on_cuda(model_dir: str) -> None:
    prompts = _prompts(8, 1)
    params = [
        SamplingParams(n=2, temperature=0.9, seed=i, max_tokens=40, ignore_eos=True)
        for i in range(len(prompts))
    ]
    kw = {"num_gpu_blocks_override": 24, "block_size": 16}
    assert _run(model_dir, True, prompts, params, **kw) == _run(
        model_dir, False, prompts, params, **kw
    )
