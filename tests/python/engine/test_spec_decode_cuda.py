"""N-gram speculative decoding on a CUDA GPU: the k+1-token verification runs through the paged
extend kernel, plain decode through the decode kernel (or its CUDA graph). In float32 the two
agree to rounding, so greedy outputs must be identical; no block may leak, also under
preemption (a small cache)."""

from __future__ import annotations

import pytest
from support.deps import need
from support.speculation import CUDA_SHAPE, cuda_greedy_tokens

torch = need("torch")

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
        num_hidden_layers=4,
        **CUDA_SHAPE,
    )


def _tokens(model_dir: str, **kw) -> tuple:
    return cuda_greedy_tokens(model_dir, PROMPTS, **kw)


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
