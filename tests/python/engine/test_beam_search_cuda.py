"""LLM.beam_search on a CUDA GPU (float32 tiny random Llama) equals HF's beam search on the CPU,
and leaves no request or KV block behind (the CPU twin: test_beam_search.py)."""

from __future__ import annotations

from typing import Any

import pytest
from support.beam_reference import hf_beams
from support.deps import need
from support.engine import assert_no_leak

torch = need("torch")
need("transformers")

from pagedkv import LLM, BeamSearchParams  # noqa: E402
from pagedkv.engine.beam_search import beam_score  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

pytestmark = pytest.mark.cuda

VOCAB, MAX_TOKENS = 512, 8


@pytest.fixture(scope="module")
def model(tmp_path_factory: Any) -> str:
    return save_random_model(
        str(tmp_path_factory.mktemp("beam_cuda")),
        "tiny-llama",
        seed=3,
        tokenizer=False,
        vocab_size=VOCAB,
        head_dim=64,
    )


@pytest.mark.parametrize("width, lp", [(2, 1.0), (4, 0.5)])
def test_beam_search_on_cuda_equals_hf(model: str, width: int, lp: float) -> None:
    llm = LLM(
        model,
        device="cuda",
        dtype="float32",
        skip_tokenizer_init=True,
        block_size=16,
        max_model_len=256,
        num_gpu_blocks_override=128,
    )
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (5, 17, 40)]
    params = BeamSearchParams(width, MAX_TOKENS, ignore_eos=True, length_penalty=lp)
    outs = llm.beam_search([{"prompt_token_ids": p} for p in prompts], params)
    assert_no_leak(llm)
    for prompt, out in zip(prompts, outs):
        expected = hf_beams(model, prompt, width, lp, False, MAX_TOKENS)
        got = [
            (s.generated_token_ids, beam_score(s.cum_logprob, MAX_TOKENS, lp))
            for s in out.sequences
        ]
        assert [t for t, _ in got] == [t for t, _ in expected]
        for (_, a), (_, b) in zip(got, expected):
            assert a == pytest.approx(b, abs=1e-3)
