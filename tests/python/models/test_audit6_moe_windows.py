"""Sliding windows on the MoE families (issue #27: honoured wherever a config declares it):
Mixtral (every layer), Qwen3-MoE and Qwen2-MoE (with use_sliding_window) on tiny random
checkpoints, windows shorter than the prompts, the paged CPU engine's greedy tokens and logprobs
against HF transformers' generate (float32); the same weights without the window generate
something else, so the comparison can fail."""

from __future__ import annotations

import json

import pytest
from support.deps import need
from support.hf_compare import assert_same_greedy, chunked_cpu_llm, engine_greedy, hf_greedy

need("torch")
need("transformers")

from pagedkv.models.config import ModelConfig  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 256
WINDOW = 5
CASES = {
    "mixtral": ("tiny-mixtral", {"sliding_window": WINDOW}),
    "qwen3-moe": ("tiny-qwen3-moe", {"use_sliding_window": True, "sliding_window": WINDOW}),
    "qwen2-moe": (
        "tiny-qwen2-moe",
        {
            "use_sliding_window": True,
            "sliding_window": WINDOW,
            "max_window_layers": 2,
            "tie_word_embeddings": False,  # (tied: near one-hot logits)
        },
    ),
}


def _prompts() -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(4)
    return [rng.integers(3, VOCAB, int(n)).tolist() for n in (12, 21, 33)]  # all > WINDOW


@pytest.mark.parametrize("case", sorted(CASES))
def test_moe_window_shorter_than_prompt_matches_hf(case: str, tmp_path) -> None:
    preset, overrides = CASES[case]
    path = save_random_model(
        str(tmp_path / case), preset, seed=13, tokenizer=False, vocab_size=VOCAB, **overrides
    )
    with open(f"{path}/config.json") as f:
        windowed_cfg = json.load(f)
    config = ModelConfig.from_hf_dict(windowed_cfg)
    assert any(config.layer_sliding_window(i) == WINDOW for i in range(config.num_hidden_layers))
    prompts = _prompts()
    got = engine_greedy(chunked_cpu_llm(path), prompts, 16)
    assert_same_greedy(got, hf_greedy(path, prompts, 16))

    windowed_cfg["sliding_window"] = None
    windowed_cfg.pop("use_sliding_window", None)
    with open(f"{path}/config.json", "w") as f:
        json.dump(windowed_cfg, f)
    assert engine_greedy(chunked_cpu_llm(path), prompts, 16) != got, "the window changed nothing"
