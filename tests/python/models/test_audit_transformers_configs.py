"""Audit 2026-11-27: checkpoints written by transformers' own classes (not pagedkv.testing's
presets) run as HF does. A Qwen3-MoE checkpoint saved by transformers >= 5 names its expert
count `num_local_experts` (the hub's checkpoints say `num_experts`) and was refused with
"'num_experts' is missing"."""

from __future__ import annotations

import numpy as np
import pytest
from support.deps import need
from support.hf_compare import assert_same_greedy, engine_greedy, hf_greedy

torch = need("torch")
transformers = need("transformers")

from pagedkv import LLM  # noqa: E402

VOCAB = 128


def _save_qwen3_moe(path: str, rename_to_hub_key: bool) -> str:
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=128,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # norms around 1, never exactly 1
            p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name else 0.08 * torch.randn_like(p))
    model.save_pretrained(path)
    if rename_to_hub_key:  # as Qwen/Qwen3-30B-A3B's config.json writes it
        import json

        with open(f"{path}/config.json") as f:
            d = json.load(f)
        d["num_experts"] = d.pop("num_local_experts", d.get("num_experts"))
        with open(f"{path}/config.json", "w") as f:
            json.dump(d, f)
    return path


@pytest.mark.parametrize("hub_key", [False, True], ids=["num_local_experts", "num_experts"])
def test_qwen3_moe_saved_by_transformers_matches_hf(tmp_path, hub_key: bool) -> None:
    path = _save_qwen3_moe(str(tmp_path / "qwen3moe"), hub_key)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, VOCAB, n).tolist() for n in (7, 19, 30)]
    llm = LLM(
        path,
        skip_tokenizer_init=True,
        device="cpu",
        dtype="float32",
        block_size=8,
        num_gpu_blocks_override=32,
        max_model_len=64,
        max_num_batched_tokens=16,
    )
    assert_same_greedy(engine_greedy(llm, prompts, 16), hf_greedy(path, prompts, 16))
