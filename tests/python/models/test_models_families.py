"""Every model family on tiny random checkpoints (random non-zero biases and norm weights):
the paged CPU engine's greedy tokens equal HF transformers' generate (float32), 3 prompts x 16
tokens, logprobs within 1e-4; a bf16 checkpoint; sequence-classification heads' logits."""

from __future__ import annotations

import pytest
from support.deps import need
from support.hf_compare import (
    assert_classifier_matches_hf,
    assert_engine_matches_hf,
    random_prompts,
)

torch = need("torch")
need("transformers")

from pagedkv.testing import save_random_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 256
CASES = {
    "qwen3": ("tiny-qwen3", {}),
    "qwen3-window": (
        "tiny-qwen3",
        {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1},
    ),
    "gemma2": ("tiny-gemma2", {}),
    "gemma3": ("tiny-gemma3", {}),
    "phi3-longrope": ("tiny-phi3", {}),
    "phi3-window-partial-rotary": (
        "tiny-phi3",
        {"sliding_window": 9, "rope_scaling": None, "partial_rotary_factor": 0.5},
    ),
    "gpt2": ("tiny-gpt2", {}),
    "gpt-neox": ("tiny-gpt-neox", {}),
    "gpt-neox-sequential": ("tiny-gpt-neox", {"use_parallel_residual": False, "rotary_pct": 0.5}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_matches_hf(case: str, tmp_path) -> None:
    preset, overrides = CASES[case]
    path = save_random_model(
        str(tmp_path / case), preset, seed=7, tokenizer=False, vocab_size=VOCAB, **overrides
    )
    worst = assert_engine_matches_hf(path, random_prompts(len(case), VOCAB))
    print(f"{case}: max logprob gap vs HF {worst:.2e}")


def test_bf16_checkpoint_matches_hf(tmp_path) -> None:
    """Weights stored in bfloat16, both sides computing in float32 from the same values."""
    path = save_random_model(
        str(tmp_path / "bf16"),
        "tiny-gemma2",
        seed=8,
        tokenizer=False,
        vocab_size=VOCAB,
        dtype=torch.bfloat16,
    )
    assert_engine_matches_hf(path, random_prompts(3, VOCAB))


CLASSIFIERS = {
    "llama": ("tiny-llama", "LlamaForSequenceClassification"),
    "qwen3": ("tiny-qwen3", "Qwen3ForSequenceClassification"),
    "gemma2": ("tiny-gemma2", "Gemma2ForSequenceClassification"),
    "gpt2": ("tiny-gpt2", "GPT2ForSequenceClassification"),
    "gpt-neox": ("tiny-gpt-neox", "GPTNeoXForSequenceClassification"),
    "phi3": ("tiny-phi3", "Phi3ForSequenceClassification"),
    "opt": ("tiny-opt", "OPTForSequenceClassification"),
    "qwen2": ("tiny-qwen2", "Qwen2ForSequenceClassification"),
    "mistral": ("tiny-mistral", "MistralForSequenceClassification"),
    "gemma3": ("tiny-gemma3", "Gemma3ForSequenceClassification"),
    # MoE bases (audit6: they were refused as unsupported architectures).
    "mixtral": ("tiny-mixtral", "MixtralForSequenceClassification"),
    "qwen2-moe": ("tiny-qwen2-moe", "Qwen2MoeForSequenceClassification"),
    "qwen3-moe": ("tiny-qwen3-moe", "Qwen3MoeForSequenceClassification"),
}


@pytest.mark.parametrize("case", sorted(CLASSIFIERS))
def test_sequence_classifier_matches_hf(case: str, tmp_path) -> None:
    preset, arch = CLASSIFIERS[case]
    path = save_random_model(
        str(tmp_path / case),
        preset,
        seed=9,
        tokenizer=False,
        vocab_size=VOCAB,
        architectures=[arch],
        num_labels=3,
        pad_token_id=0,
    )
    model, hidden = assert_classifier_matches_hf(path, random_prompts(11, VOCAB), num_labels=3)
    with pytest.raises(ValueError, match="does not generate"):
        model.compute_logits(hidden)
