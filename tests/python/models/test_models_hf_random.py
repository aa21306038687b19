"""Random-weight Llama / Qwen2 / Mistral / OPT checkpoints (pagedkv.testing), loaded by
both HF transformers and pagedkv: logits of a batch of sequences must agree in float32."""

from __future__ import annotations

import pytest
from support.deps import need

torch = need("torch")
transformers = need("transformers")

from pagedkv.models import load_model  # noqa: E402
from pagedkv.models.reference_backend import DenseAttentionBackend  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 512
CASES = {
    "llama-gqa": ("tiny-llama", {}),
    "llama-rope-llama3": (
        "tiny-llama",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 4.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            }
        },
    ),
    "llama-rope-linear": ("tiny-llama", {"rope_scaling": {"type": "linear", "factor": 2.0}}),
    "llama-rope-yarn": (
        "tiny-llama",
        {
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        },
    ),
    "llama-rope-dynamic": (
        "tiny-llama",
        {"max_position_embeddings": 24, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
    ),
    "qwen2-bias-tied": ("tiny-qwen2", {}),
    "mistral": ("tiny-mistral", {}),
    "mistral-window": ("tiny-mistral", {"sliding_window": 5}),
    "qwen2-window-layers": (
        "tiny-qwen2",
        {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1},
    ),
    "opt": ("tiny-opt", {}),
    "opt-post-norm-proj": ("tiny-opt", {"do_layer_norm_before": False, "word_embed_proj_dim": 32}),
}


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_hf(case: str, tmp_path) -> None:
    preset, overrides = CASES[case]
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    path = save_random_model(
        str(tmp_path / case), preset, seed=seed, tokenizer=False, vocab_size=VOCAB, **overrides
    )
    model, config = load_model(path, torch.float32, "cpu")
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    if "rope_scaling" in overrides:  # both sides must really use the scaled rope
        hf_rope = getattr(ref.config, "rope_parameters", None) or ref.config.rope_scaling
        assert hf_rope["rope_type"] == config.rope_scaling["rope_type"] != "default"

    g = torch.Generator().manual_seed(seed)
    lengths = [1, 7, 40, 23]  # 40 > 24 and > 32: past the trained length of the rope variants
    seqs = [torch.randint(0, VOCAB, (n,), generator=g) for n in lengths]
    dynamic = case.endswith("dynamic")  # HF scales by each sequence's own length: one at a time
    groups = [[s] for s in seqs] if dynamic else [seqs]
    worst = 0.0
    for group in groups:
        loc = [0]
        for s in group:
            loc.append(loc[-1] + len(s))
        ids = torch.cat(group)
        positions = torch.cat([torch.arange(len(s)) for s in group])
        logits = model.compute_logits(model(ids, positions, DenseAttentionBackend(loc)))
        with torch.no_grad():
            for i, s in enumerate(group):
                expected = ref(s[None]).logits[0].float()
                worst = max(worst, _rel_err(logits[loc[i] : loc[i + 1]], expected))
    print(f"{case}: max relative logits error vs HF {worst:.2e}")
    assert worst < 1e-4, worst


def test_missing_weight_is_reported(tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    path = save_random_model(str(tmp_path / "m"), "tiny-llama", tokenizer=False, vocab_size=VOCAB)
    tensors = load_file(f"{path}/model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, f"{path}/model.safetensors")
    with pytest.raises(ValueError, match="missing weights"):
        load_model(path, torch.float32, "cpu")
