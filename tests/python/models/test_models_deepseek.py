"""DeepSeek-V2 / V3 (multi-head latent attention, grouped-routing MoE) on the paged CPU engine
against HF transformers float32 on tiny random checkpoints (non-zero biases, norm weights and
router correction biases): the same greedy tokens over 3 prompts x 16 tokens, logprobs within
1e-4. The cases cover a query with and without the low-rank bottleneck, value heads wider and
narrower than the keys (the padded cache), interleaved and rotate-half rope, YaRN's mscale,
softmax "greedy" / "group_limited_greedy" and V3's "noaux_tc" routing."""

from __future__ import annotations

import pytest
from support.deps import need
from support.hf_compare import (
    assert_classifier_matches_hf,
    assert_engine_matches_hf,
    chunked_cpu_llm,
    random_prompts,
)

torch = need("torch")
need("transformers")

from pagedkv.models.config import ModelConfig  # noqa: E402
from pagedkv.testing import hf_config, save_random_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

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


@pytest.mark.parametrize("case", sorted(CASES))
def test_deepseek_greedy_matches_hf(case: str, tmp_path) -> None:
    preset, overrides = CASES[case]
    path = save_random_model(
        str(tmp_path / case), preset, seed=7, tokenizer=False, vocab_size=VOCAB, **overrides
    )
    worst = assert_engine_matches_hf(path, random_prompts(len(case), VOCAB))
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
    assert_engine_matches_hf(path, random_prompts(3, VOCAB))


@pytest.mark.parametrize("version", ["2", "3"])
def test_deepseek_sequence_classifier_matches_hf(version: str, tmp_path) -> None:
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
    assert_classifier_matches_hf(path, random_prompts(11, VOCAB), num_labels=3)


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
        chunked_cpu_llm(path)
