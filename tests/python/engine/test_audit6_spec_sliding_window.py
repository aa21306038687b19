"""Speculative decoding on sliding-window models (issues #27 and #33 together): the k+1 rows of
a verification run through the extend path, each with its own window, and a draft model keeps
its own windowed cache. Greedy speculation must give HF transformers' greedy tokens (float32)
on a Mistral (every layer windowed) and a Gemma 2 (alternating windows, soft caps), windows of
5 tokens far shorter than the prompts; drafts are accepted, so the verify path really ran."""

from __future__ import annotations

from typing import Any, Dict

import pytest
from support.deps import need
from support.engine import assert_no_leak
from support.hf_compare import WINDOWED_SHAPE, hf_greedy, windowed_cpu_llm
from support.speculation import output_tokens

need("torch")
need("transformers")

from pagedkv import SamplingParams  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MODELS = {"mistral": ("tiny-mistral", WINDOWED_SHAPE), "gemma2": ("tiny-gemma2", {})}
# Self-repeating prompts, so that n-gram lookup finds drafts.
PROMPTS = [[5, 6, 7, 8, 9] * 6 + [5, 6], [10, 11, 12, 13] * 5, [200, 201, 17] * 7]
METHODS: Dict[str, Any] = {
    "ngram": lambda path: {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    },
    "draft": lambda path: {"model": path, "num_speculative_tokens": 3},  # the target itself
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request: Any, tmp_path_factory: Any) -> tuple:
    preset, shape = MODELS[request.param]
    path = save_random_model(
        str(tmp_path_factory.mktemp(request.param)),
        preset,
        seed=11,
        tokenizer=False,
        vocab_size=256,
        sliding_window=5,
        **shape,
    )
    return path, [tokens for tokens, _ in hf_greedy(path, PROMPTS, 24)]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_greedy_speculation_with_windows_equals_hf(model: tuple, method: str) -> None:
    path, expected = model
    llm = windowed_cpu_llm(path, speculative_config=METHODS[method](path))
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    assert output_tokens(llm, params, PROMPTS) == expected
    assert llm.llm_engine.get_stats()["spec_decode_num_accepted_tokens"] > 0
    assert_no_leak(llm)
