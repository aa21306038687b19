"""DeepSeek-V2 / V3 (multi-head latent attention, grouped-routing MoE) on the paged CPU engine
against HF transformers float32 on tiny random checkpoints (non-zero biases, norm weights and
router correction biases): the same greedy tokens over 3 prompts x 16 tokens, logprobs within
1e-4. The cases cover a query with and without the low-rank bottleneck, value heads wider and
narrower than the keys (the padded cache), interleaved and rotate-half rope, YaRN's mscale,
softmax "greedy" / "group_limited_greedy" and V3's "noaux_tc" routing."""

from __future__ import annotations

import numpy as np
import pytest
from support.deps import need
from support.hf_compare import assert_same_greedy, engine_greedy, hf_greedy

torch = need("torch")
need("transformers")

from pagedkv import LLM  # noqa: E402
from pagedkv.models import load_model  # noqa: E402
from pagedkv.models.config import ModelConfig  # noqa: E402
from pagedkv.models.reference_backend import DenseAttentionBackend  # noqa: E402
from pagedkv.testing import hf_config, save_random_model  # noqa: E402

VOCAB = 256
CASES = {
    "v2": ("tiny-deepseek-v2", {}),
    "v2-q-lora-greedy": (
        "tiny-deepseek-v2",
        {"q_lora_rank": 24, "topk_method": "greedy", "rope_scaling": None, "v_head_dim": 32},
    ),
    # The released models' head sizes: K 128 + 64 = 192, V 128 padded to 192.
    "v2-head-192": (
        "tiny-deepseek-v2",
        {
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
            "topk_method": "greedy",
        },
    ),
    "v3": ("tiny-deepseek-v3", {}),
    "v3-rotate-half-yarn": (
        "tiny-deepseek-v3",
        {
            "rope_interleave": False,
            "q_lora_rank": None,
            "rope_scaling": {
                "type": "yarn",
                "factor": 8.0,
                "original_max_position_embeddings": 32,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
        },
    ),
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
    # Small blocks and steps: prompts prefill in chunks and decode across blocks.
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
def test_deepseek_greedy_matches_hf(case: str, tmp_path) -> None:
    preset, overrides = CASES[case]
    path = save_random_model(
        str(tmp_path / case), preset, seed=7, tokenizer=False, vocab_size=VOCAB, **overrides
    )
    prompts = _prompts(len(case))
    worst = assert_same_greedy(engine_greedy(_llm(path), prompts, 16), hf_greedy(path, prompts, 16))
    print(f"{case}: max logprob gap vs HF {worst:.2e}")


def test_deepseek_bf16_checkpoint_matches_hf(tmp_path) -> None:
    """Weights stored in bfloat16 (the router's too), both sides computing in float32."""
    path = save_random_model(
        str(tmp_path / "bf16"),
        "tiny-deepseek-v3",
        seed=8,
        tokenizer=False,
        vocab_size=VOCAB,
        dtype=torch.bfloat16,
    )
    prompts = _prompts(3)
    assert_same_greedy(engine_greedy(_llm(path), prompts, 16), hf_greedy(path, prompts, 16))


@pytest.mark.parametrize("version", ["2", "3"])
def test_deepseek_sequence_classifier_matches_hf(version: str, tmp_path) -> None:
    import transformers

    arch = f"DeepseekV{version}ForSequenceClassification"
    path = save_random_model(
        str(tmp_path / arch),
        f"tiny-deepseek-v{version}",
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


@pytest.mark.parametrize(
    ("preset", "overrides", "message"),
    [
        ("tiny-deepseek-v2", {"norm_topk_prob": True}, "norm_topk_prob"),
        ("tiny-deepseek-v2", {"topk_method": "noaux_tc"}, "topk_method"),
        ("tiny-deepseek-v3", {"scoring_func": "softmax"}, "scoring_func"),
        ("tiny-deepseek-v2", {"num_key_value_heads": 2}, "num_key_value_heads"),
        ("tiny-deepseek-v3", {"n_group": 3}, "n_group"),
    ],
)
def test_deepseek_configs_it_cannot_run_are_refused(preset, overrides, message) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf_dict(hf_config(preset, vocab_size=VOCAB, **overrides))


def test_deepseek_head_size_the_kernels_lack_is_refused(tmp_path) -> None:
    """The cache head size is max(nope + rope, v); one the paged kernels lack is refused at
    load, naming the supported sizes."""
    path = save_random_model(
        str(tmp_path / "m"),
        "tiny-deepseek-v3",
        tokenizer=False,
        vocab_size=VOCAB,
        qk_nope_head_dim=40,  # 40 + 16 = 56
        v_head_dim=32,
    )
    with pytest.raises(ValueError, match="head size 56.*supported head sizes"):
        _llm(path)
