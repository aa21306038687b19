"""Draft-model speculative decoding on a CUDA GPU (float32 tiny random Llamas): the draft's
forwards replay its own CUDA graphs (decodes, and catch-ups of up to 2 tokens), the target
verifies through its verification graphs; greedy output equals plain greedy, also under
preemption, and a draft equal to the target agrees on (nearly) every draft."""

from __future__ import annotations

from typing import Any, Dict

import pytest
from support.deps import need
from support.engine import assert_no_leak

torch = need("torch")

from pagedkv.engine.llm import LLM  # noqa: E402
from pagedkv.engine.sampling_params import SamplingParams  # noqa: E402

pytestmark = pytest.mark.cuda

PROMPTS = [
    [5, 6, 7, 8, 9] * 6 + [5, 6],
    list(range(100, 140)) + list(range(100, 120)),
    [128, 6] * 8 + [3, 4, 5],
    [200, 201, 202, 17, 18] * 4,
]
SHAPE: Dict[str, Any] = dict(
    tokenizer=False,
    hidden_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=512,
    vocab_size=2048,
    max_position_embeddings=1024,
)


@pytest.fixture(scope="module")
def models(tmp_path_factory: Any) -> Dict[str, str]:
    from pagedkv.testing import save_random_model

    def save(name: str, layers: int, seed: int) -> str:
        path = str(tmp_path_factory.mktemp(name))
        return save_random_model(path, "tiny-llama", seed=seed, num_hidden_layers=layers, **SHAPE)

    return {"target": save("draft_cuda_target", 4, 3), "draft": save("draft_cuda_small", 1, 5)}


def _run(model: str, draft: Any = None, **kw: Any) -> Any:
    spec = {"model": draft, "num_speculative_tokens": 3} if draft else None
    llm = LLM(
        model,
        device="cuda",
        dtype="float32",
        skip_tokenizer_init=True,
        max_model_len=512,
        block_size=16,
        speculative_config=spec,
        **{"num_gpu_blocks_override": 512, **kw},
    )
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    assert_no_leak(llm)
    return [list(o.outputs[0].token_ids) for o in outs], llm.llm_engine


@pytest.mark.parametrize(("blocks", "eager"), [(512, False), (512, True), (14, False)])
def test_greedy_with_a_draft_model_on_cuda_equals_plain_greedy(
    models: Dict[str, str], blocks: int, eager: bool
) -> None:
    want, _ = _run(models["target"])
    got, engine = _run(
        models["target"], models["draft"], num_gpu_blocks_override=blocks, enforce_eager=eager
    )
    assert got == want
    assert engine.get_stats()["spec_decode_num_drafts"] > 0
    draft = engine.runner.draft
    assert (draft.graphs is None) == eager
    if not eager:
        assert draft.graphs.num_replays > 0 and engine.runner.verify_graphs.num_replays > 0
    if blocks < 512:
        assert engine.get_stats()["num_preemptions"] > 0


def test_a_draft_equal_to_the_target_on_cuda_accepts_nearly_every_draft(
    models: Dict[str, str],
) -> None:
    """Graph-replayed draft forwards and the target's verification compute the same model;
    float32 rounding between the decode and extend kernels may flip a rare near-tie."""
    want, _ = _run(models["target"])
    got, engine = _run(models["target"], models["target"])
    assert got == want
    stats = engine.get_stats()
    assert stats["spec_decode_num_accepted_tokens"] >= 0.95 * stats["spec_decode_num_draft_tokens"]
    assert engine.runner.draft.verify_graphs.num_replays > 0  # catch-ups of 2 tokens
