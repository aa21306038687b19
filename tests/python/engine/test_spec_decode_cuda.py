"""N-gram speculative decoding on a CUDA GPU: the k+1-token verification runs through the paged
extend kernel, plain decode through the decode kernel (or its CUDA graph). In float32 the two
agree to rounding, so greedy outputs must be identical; no block may leak, also under
preemption (a small cache)."""

from __future__ import annotations

import pytest
from support.deps import need
from support.engine import assert_no_leak

torch = need("torch")

from pagedkv.engine.llm import LLM  # noqa: E402
from pagedkv.engine.sampling_params import SamplingParams  # noqa: E402

pytestmark = pytest.mark.cuda

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
PROMPTS = [
    [5, 6, 7, 8, 9] * 6 + [5, 6],
    list(range(100, 140)) + list(range(100, 120)),
    [128, 6] * 8 + [3, 4, 5],
    [200, 201, 202, 17, 18] * 4,
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from pagedkv.testing import save_random_model

    return save_random_model(
        str(tmp_path_factory.mktemp("spec_cuda")),
        "tiny-llama",
        seed=3,
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


def _tokens(model_dir: str, **kw) -> tuple:
    llm = LLM(
        model_dir,
        device="cuda",
        dtype="float32",
        skip_tokenizer_init=True,
        max_model_len=512,
        block_size=16,
        **{"num_gpu_blocks_override": 512, **kw},
    )
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    assert_no_leak(llm)
    return [list(o.outputs[0].token_ids) for o in outs], llm.llm_engine


@pytest.mark.parametrize(("blocks", "eager"), [(512, False), (512, True), (12, False)])
def test_greedy_speculation_on_cuda_equals_plain_greedy(
    model_dir: str, blocks: int, eager: bool
) -> None:
    """Verification steps replayed from CUDA graphs (each entry padded to k+1 tokens) or run
    eagerly; with a 12-block cache, under preemption."""
    want, _ = _tokens(model_dir)
    got, engine = _tokens(
        model_dir, speculative_config=NGRAM, num_gpu_blocks_override=blocks, enforce_eager=eager
    )
    assert got == want
    stats = engine.get_stats()
    assert stats["spec_decode_num_drafts"] > 0
    graphs = engine.runner.verify_graphs
    assert (graphs is None) == eager
    if not eager:
        assert graphs.num_replays > 0
    if blocks == 12:
        assert stats["num_preemptions"] > 0
