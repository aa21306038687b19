"""Every model family on tiny random checkpoints (random non-zero biases and norm weights):
the paged CPU engine's greedy tokens equal HF transformers' generate (float32), 3 prompts x 16
tokens, logprobs within 1e-4; a bf16 checkpoint; sequence-classification heads' logits."""

from __future__ import annotations

import numpy as np
import pytest
from support.deps import need
from support.hf_compare import assert_same_greedy, engine_greedy, hf_greedy

torch = need("torch")
transformers = need("transformers")

from pagedkv import LLM  # noqa: E402
from pagedkv.models import load_model  # noqa: E402
from pagedkv.models.reference_backend import DenseAttentionBackend  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

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


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _prompts(seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, int(n)).tolist() for n in rng.integers(5, 40, 3)]


def _llm(path: str) -> LLM:
    # Small blocks and steps: prompts prefill in chunks and decode across many blocks.
    return LLM(
        path,
        skip_tokenizer_init=True,
        device="cpu",
        dtype="float32",
        seed=0,
        block_size=8,
        num_gpu_blocks_override=64,
        max_model_len=128,
        max_num_batched_tokens=32,
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_matches_hf(case: str, tmp_path) -> None:
    preset, overrides = CASES[case]
    path = save_random_model(
        str(tmp_path / case), preset, seed=7, tokenizer=False, vocab_size=VOCAB, **overrides
    )
    prompts = _prompts(len(case))
    worst = assert_same_greedy(engine_greedy(_llm(path), prompts, 16), hf_greedy(path, prompts, 16))
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
    prompts = _prompts(3)
    assert_same_greedy(engine_greedy(_llm(path), prompts, 16), hf_greedy(path, prompts, 16))


CLASSIFIERS = {
    "llama": ("tiny-llama", "LlamaForSequenceClassification"),
    "qwen3": ("tiny-qwen3", "Qwen3ForSequenceClassification"),
    "gemma2": ("tiny-gemma2", "Gemma2ForSequenceClassification"),
    "gpt2": ("tiny-gpt2", "GPT2ForSequenceClassification"),
    "gpt-neox": ("tiny-gpt-neox", "GPTNeoXForSequenceClassification"),
    "phi3": ("tiny-phi3", "Phi3ForSequenceClassification"),
    "opt": ("tiny-opt", "OPTForSequenceClassification"),
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
    model, config = load_model(path, torch.float32, "cpu")
    assert config.is_classifier and config.num_labels == 3
    ref = transformers.AutoModelForSequenceClassification.from_pretrained(
        path, dtype=torch.float32
    ).eval()
    seqs = [torch.tensor(p) for p in _prompts(11)]
    loc = np.cumsum([0] + [len(s) for s in seqs]).tolist()
    hidden = model(
        torch.cat(seqs), torch.cat([torch.arange(len(s)) for s in seqs]), DenseAttentionBackend(loc)
    )
    got = model.classify(hidden[[b - 1 for b in loc[1:]]])
    with torch.no_grad():
        expected = torch.cat([ref(s[None]).logits for s in seqs])
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="does not generate"):
        model.compute_logits(hidden)
