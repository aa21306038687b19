"""LLaVA-NeXT image inputs against HF transformers: a tiny random
LlavaNextForConditionalGeneration (CLIP tower on 28-pixel crops, anyres grid pinpoints up to
56 x 84, random weights with non-zero biases and norm weights) saved with its
LlavaNextProcessor; greedy tokens equal to HF's generate (float32, CPU) on image + text
prompts, two images of different shapes in one prompt, and a batch mixing image and text-only
prompts, with whole and chunked prefills."""

from __future__ import annotations

import pytest
from support.deps import need
from support.images import (
    assert_greedy_matches,
    hf_greedy_with_logprobs,
    image_prompts,
    random_image,
)

torch = need("torch")
need("transformers")
need("PIL")

from pagedkv import LLM, SamplingParams  # noqa: E402
from pagedkv.testing import save_random_llava_next  # noqa: E402

MAX_TOKENS = 8
# Greedy with each token's logprob, compared to HF's too (tighter than the tokens alone).
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=0)
# Shapes that pick different grid pinpoints (and so different tile and row counts).
CASES = [
    ("USER: <image>\nWhat is shown here? ASSISTANT:", [(1, 37, 45)]),
    ("USER: <image> and <image>: which is brighter? ASSISTANT:", [(2, 60, 30), (3, 20, 80)]),
    ("USER: tell me a story ASSISTANT:", []),
    ("USER: <image> describe ASSISTANT:", [(4, 28, 28)]),
]


@pytest.fixture(scope="module")
def llava_next_dir(tmp_path_factory) -> str:
    return save_random_llava_next(str(tmp_path_factory.mktemp("tiny_llava_next")), seed=5)


def _hf_greedy(folder: str, cases: list) -> list[tuple[list[int], list[float], int]]:
    """HF's greedy tokens, their logprobs and its expanded prompt length, prompt by prompt."""
    from transformers import AutoProcessor, LlavaNextForConditionalGeneration

    processor = AutoProcessor.from_pretrained(folder)
    model = LlavaNextForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    out = []
    for prompt, shapes in cases:
        images = [random_image(*s) for s in shapes] or None
        inputs = processor(text=prompt, images=images, return_tensors="pt")
        tokens, logprobs = hf_greedy_with_logprobs(model, inputs, MAX_TOKENS)
        out.append((tokens, logprobs, inputs["input_ids"].shape[1]))
    return out


def _assert_matches(outs: list, expected: list, what: object, atol: float = 1e-4) -> None:
    for out, (tokens, logprobs, n) in zip(outs, expected):
        # The engine's expanded prompt has HF's length (rows per image from the processor).
        assert len(out.prompt_token_ids) == n, what
        assert_greedy_matches(out, tokens, logprobs, what, atol)


def test_greedy_equals_hf_mixed_batch(llava_next_dir: str) -> None:
    expected = _hf_greedy(llava_next_dir, CASES)
    chunked = {"max_num_batched_tokens": 24, "max_num_seqs": 3}
    for kw in ({}, chunked):
        llm = LLM(
            llava_next_dir, device="cpu", kv_cache_space=0.02, max_model_len=320, block_size=8, **kw
        )
        outs = llm.generate(image_prompts(CASES), GREEDY, use_tqdm=False)
        _assert_matches(outs, expected, kw)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_greedy_equals_hf_on_cuda(llava_next_dir: str) -> None:
    """The CUDA kernels (float32, eager prefill and CUDA-graph decode) against HF on the CPU."""
    expected = _hf_greedy(llava_next_dir, CASES)
    llm = LLM(llava_next_dir, device="cuda", dtype="float32", max_model_len=320, block_size=16)
    outs = llm.generate(image_prompts(CASES), GREEDY, use_tqdm=False)
    _assert_matches(outs, expected, "cuda", atol=2e-3)
