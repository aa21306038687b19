"""Sliding-window attention end to end (the paged engine on the CPU) against HF transformers'
greedy generate, float32: windows shorter than the prompt, chunked prefill and prefix-cache hits
across the window's edge, decodes far past it; Qwen2's windows from max_window_layers on."""

from __future__ import annotations

import numpy as np
import pytest
from support.deps import need
from support.hf_compare import (
    WINDOWED_SHAPE,
    assert_same_greedy,
    engine_greedy,
    hf_greedy,
    windowed_cpu_llm,
)

torch = need("torch")
need("transformers")

from pagedkv.models.config import ModelConfig  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 256
WINDOW = 7  # not a multiple of the block size: the window's edge falls inside a block
SHAPE = dict(WINDOWED_SHAPE, vocab_size=VOCAB)


def _prompts(n: int, seed: int, lo: int, hi: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, int(rng.integers(lo, hi))).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def mistral(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("mistral_window"))
    return save_random_model(
        out, "tiny-mistral", seed=11, tokenizer=False, sliding_window=WINDOW, **SHAPE
    )


def test_config_reads_windows_as_transformers_does() -> None:
    from pagedkv.testing import hf_config

    mistral = ModelConfig.from_hf_dict(hf_config("tiny-mistral", sliding_window=5))
    assert [mistral.layer_sliding_window(i) for i in range(2)] == [5, 5]
    # Qwen2: no window without use_sliding_window; with it, from max_window_layers on.
    qwen = hf_config("tiny-qwen2", num_hidden_layers=4, sliding_window=5, max_window_layers=1)
    assert ModelConfig.from_hf_dict({**qwen, "use_sliding_window": False}).sliding_window is None
    q = ModelConfig.from_hf_dict({**qwen, "use_sliding_window": True})
    assert [q.layer_sliding_window(i) for i in range(4)] == [None, 5, 5, 5]
    explicit = {
        **qwen,
        "use_sliding_window": True,
        "layer_types": ["full_attention", "sliding_attention"] * 2,
    }
    e = ModelConfig.from_hf_dict(explicit)
    assert [e.layer_sliding_window(i) for i in range(4)] == [None, 5, None, 5]
    with pytest.raises(ValueError, match="layer_types"):
        ModelConfig.from_hf_dict({**explicit, "layer_types": ["chunked_attention"] * 4})


def test_mistral_window_shorter_than_prompt_matches_hf(mistral: str) -> None:
    prompts = _prompts(3, 1, 20, 40)
    expected = hf_greedy(mistral, prompts, 16)
    worst = assert_same_greedy(engine_greedy(windowed_cpu_llm(mistral), prompts, 16), expected)
    print(f"max logprob gap vs HF: {worst:.2e}")


def test_window_is_not_ignored(mistral: str, tmp_path) -> None:
    """The same weights without the window generate something else: the test above can fail."""
    import json

    full = str(tmp_path / "full")
    save_random_model(
        full, "tiny-mistral", seed=11, tokenizer=False, sliding_window=WINDOW, **SHAPE
    )
    with open(f"{full}/config.json") as f:
        cfg = json.load(f)
    cfg["sliding_window"] = None
    with open(f"{full}/config.json", "w") as f:
        json.dump(cfg, f)
    prompts = _prompts(3, 1, 20, 40)
    windowed = engine_greedy(windowed_cpu_llm(mistral), prompts, 16)
    assert engine_greedy(windowed_cpu_llm(full), prompts, 16) != windowed


def test_chunked_prefill_and_decode_past_the_window(mistral: str) -> None:
    # 6-token steps: each prompt prefills over several chunks, each chunk's window reaching back
    # into blocks written by earlier steps; 40 decodes run far past the window.
    prompts = _prompts(3, 2, 15, 30)
    expected = hf_greedy(mistral, prompts, 40)
    got = engine_greedy(
        windowed_cpu_llm(mistral, max_num_batched_tokens=6, max_num_seqs=3), prompts, 40
    )
    assert_same_greedy(got, expected)


def test_prefix_cache_hits_across_the_window_edge(mistral: str) -> None:
    shared = _prompts(1, 3, 22, 23)[0]  # 5 full blocks of 4 are reused, 3 times the window
    prompts = [shared + t for t in _prompts(3, 4, 1, 6)]
    expected = hf_greedy(mistral, prompts, 16)
    llm = windowed_cpu_llm(mistral)
    first = engine_greedy(llm, prompts[:1], 16)
    rest = engine_greedy(llm, prompts[1:], 16)
    assert llm.llm_engine.scheduler.prefix_cache_hit_tokens == 2 * 20
    assert_same_greedy(first + rest, expected)


def test_qwen2_window_from_max_window_layers_matches_hf(tmp_path) -> None:
    path = save_random_model(
        str(tmp_path / "qwen2"),
        "tiny-qwen2",
        seed=5,
        tokenizer=False,
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=1,
        tie_word_embeddings=False,
        **SHAPE,
    )  # (tied: near one-hot logits)
    prompts = _prompts(3, 6, 20, 40)
    assert_same_greedy(
        engine_greedy(windowed_cpu_llm(path), prompts, 16), hf_greedy(path, prompts, 16)
    )
