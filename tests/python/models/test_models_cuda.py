"""Every family on the GPU engine (CUDA kernels, CUDA graphs for decodes, chunked prefill):
float32 against HF transformers float32 on the CPU (the same tokens, logprobs within 2e-3: the
CUDA kernels' sliding windows, soft caps and head sizes), and bf16 against HF bf16 on the GPU
(token agreement, reported). Tiny random checkpoints of head sizes 64 and 128."""

from __future__ import annotations

import numpy as np
import pytest
from support.deps import need
from support.hf_compare import assert_same_greedy, engine_greedy, hf_greedy

torch = need("torch")
need("transformers")

from pagedkv import LLM  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

pytestmark = pytest.mark.cuda

VOCAB = 512
LLAMA_SHAPE = dict(
    hidden_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=512,
    num_hidden_layers=3,
    max_position_embeddings=1024,
)
_LONGROPE = {
    "type": "longrope",
    "short_factor": [1.0 + 0.05 * i for i in range(32)],
    "long_factor": [1.0 + 0.3 * i for i in range(32)],
}
CASES = {
    # Positions past max_position_embeddings (the context stretched by linear rope scaling):
    # the rotary table must cover them before the first step (no per-step check on a GPU).
    "llama-linear-rope-past-max-pos": (
        "tiny-llama",
        dict(
            LLAMA_SHAPE,
            max_position_embeddings=64,
            rope_scaling={"rope_type": "linear", "factor": 4.0},
        ),
    ),
    "mistral-window": ("tiny-mistral", dict(LLAMA_SHAPE, sliding_window=24)),
    "qwen2-window-layers": (
        "tiny-qwen2",
        dict(
            LLAMA_SHAPE,
            use_sliding_window=True,
            sliding_window=24,
            max_window_layers=1,
            tie_word_embeddings=False,
        ),
    ),
    "qwen3-hd128": ("tiny-qwen3", dict(LLAMA_SHAPE, head_dim=128)),
    "gemma2": ("tiny-gemma2", dict(LLAMA_SHAPE, sliding_window=24, query_pre_attn_scalar=48)),
    "gemma3": ("tiny-gemma3", dict(LLAMA_SHAPE, sliding_window=24, num_hidden_layers=4)),
    "phi3-window": (
        "tiny-phi3",
        dict(
            hidden_size=256,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=512,
            max_position_embeddings=1024,
            original_max_position_embeddings=256,
            rope_scaling=_LONGROPE,
            sliding_window=40,
        ),
    ),
    "gpt2": ("tiny-gpt2", dict(n_embd=256, n_head=4, n_layer=3, n_positions=1024)),
    # MLA (K and V padded to 64 / 128 in the cache) and grouped-routing MoE on the fused experts.
    "deepseek-v2": ("tiny-deepseek-v2", dict(hidden_size=256, max_position_embeddings=1024)),
    # The released models' cache head size: K 128 + 64 = 192, V 128 padded to it.
    "deepseek-v2-hd192": (
        "tiny-deepseek-v2",
        dict(
            hidden_size=256,
            max_position_embeddings=1024,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
        ),
    ),
    "deepseek-v3": (
        "tiny-deepseek-v3",
        dict(hidden_size=256, qk_nope_head_dim=96, qk_rope_head_dim=32, v_head_dim=64),
    ),
    "gpt-neox": (
        "tiny-gpt-neox",
        dict(
            hidden_size=256,
            num_attention_heads=4,
            intermediate_size=512,
            max_position_embeddings=1024,
        ),
    ),
}


def _prompts(seed: int, lo: int = 40, hi: int = 120) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, int(n)).tolist() for n in rng.integers(lo, hi, 3)]


def _llm(path: str, dtype: str) -> LLM:
    # 32-token steps: the prompts prefill in chunks whose windows reach into earlier blocks.
    return LLM(
        path,
        skip_tokenizer_init=True,
        device="cuda",
        dtype=dtype,
        seed=0,
        num_gpu_blocks_override=256,
        max_model_len=256,
        max_num_batched_tokens=32,
    )


def _checkpoint(tmp_path, case: str, dtype: torch.dtype) -> str:
    preset, overrides = CASES[case]
    return save_random_model(
        str(tmp_path / case),
        preset,
        seed=7,
        tokenizer=False,
        vocab_size=VOCAB,
        dtype=dtype,
        **overrides,
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_float32_on_cuda_matches_hf(case: str, tmp_path) -> None:
    path = _checkpoint(tmp_path, case, torch.float32)
    prompts = _prompts(len(case))
    worst = assert_same_greedy(
        engine_greedy(_llm(path, "float32"), prompts, 24), hf_greedy(path, prompts, 24), tol=2e-3
    )
    print(f"{case}: float32 CUDA vs HF CPU, max logprob gap {worst:.2e}")


@pytest.mark.parametrize("case", sorted(CASES))
def test_bf16_on_cuda_agrees_with_hf_bf16(case: str, tmp_path) -> None:
    import transformers

    path = _checkpoint(tmp_path, case, torch.bfloat16)
    prompts = _prompts(len(case) + 1)
    got = engine_greedy(_llm(path, "bfloat16"), prompts, 24)
    ref_model = (
        transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.bfloat16, attn_implementation="eager"
        )
        .to("cuda")
        .eval()
    )
    ref_model.generation_config.eos_token_id = None
    agree = total = first = 0
    for (tokens, _), prompt in zip(got, prompts):
        with torch.no_grad():
            out = ref_model.generate(
                torch.tensor([prompt], device="cuda"),
                do_sample=False,
                max_new_tokens=24,
                min_new_tokens=24,
                pad_token_id=0,
            )
        ref = out[0, len(prompt) :].tolist()
        # Tokens agree until the first divergence (bf16 rounding differs between kernels).
        same = next((i for i, (a, b) in enumerate(zip(tokens, ref)) if a != b), len(ref))
        agree, total, first = agree + same, total + len(ref), first + (same > 0)
    print(
        f"{case}: bf16 CUDA vs HF bf16: {agree}/{total} tokens before divergence, "
        f"first token equal in {first}/{len(prompts)}"
    )
    assert first >= 2, f"{case}: the first token differs from HF's in most prompts"
