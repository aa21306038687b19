"""Mixtral / Qwen-MoE on tiny random checkpoints (pagedkv.testing) against HF transformers in
float32 on the CPU: logits of a batch of sequences, then the whole engine's greedy tokens and
their logprobs against HF ``generate`` (3 prompts x 16 tokens)."""

from __future__ import annotations

import pytest
from support.deps import need

torch = need("torch")
transformers = need("transformers")

from pagedkv import LLM, SamplingParams  # noqa: E402
from pagedkv.models import load_model  # noqa: E402
from pagedkv.models.reference_backend import DenseAttentionBackend  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 512
PRESETS = ["tiny-mixtral", "tiny-qwen2-moe", "tiny-qwen3-moe"]


def _supported(preset: str) -> None:
    from pagedkv.models.config import ModelConfig

    if preset == "tiny-qwen3-moe" and "qk_norm" not in ModelConfig.__dataclass_fields__:
        pytest.skip("Qwen3-MoE needs the q/k RMSNorm of Qwen3 (ModelConfig.qk_norm)")


@pytest.fixture(scope="module", params=PRESETS)
def checkpoint(request, tmp_path_factory) -> str:
    _supported(request.param)
    out = str(tmp_path_factory.mktemp(request.param))
    return save_random_model(out, request.param, seed=11, tokenizer=False, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def hf_model(checkpoint: str):
    return transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()


def test_logits_match_hf(checkpoint: str, hf_model) -> None:
    model, config = load_model(checkpoint, torch.float32, "cpu")
    assert config.moe is not None
    g = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, VOCAB, (n,), generator=g) for n in (1, 9, 33, 17)]
    loc = [0]
    for s in seqs:
        loc.append(loc[-1] + len(s))
    positions = torch.cat([torch.arange(len(s)) for s in seqs])
    logits = model.compute_logits(model(torch.cat(seqs), positions, DenseAttentionBackend(loc)))
    with torch.no_grad():
        for i, s in enumerate(seqs):
            expected = hf_model(s[None]).logits[0].double()
            err = (logits[loc[i] : loc[i + 1]].double() - expected).abs().max()
            assert float(err / expected.abs().max()) < 1e-4


def test_engine_greedy_matches_hf(checkpoint: str, hf_model) -> None:
    """Each engine token is HF's greedy choice given the same prefix (so HF's greedy generate
    yields the same sequence), and its logprob is HF's within 1e-4. (HF generate's own scores
    are processed: min_new_tokens masks EOS, shifting the log-softmax.)"""
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (5, 12, 27)]
    llm = LLM(
        checkpoint,
        skip_tokenizer_init=True,
        device="cpu",
        dtype="float32",
        seed=0,
        kv_cache_space=0.01,
    )
    params = SamplingParams(temperature=0.0, max_tokens=16, logprobs=0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    for prompt, out in zip(prompts, outs):
        got = list(out.outputs[0].token_ids)
        assert len(got) == 16
        with torch.no_grad():
            ref = torch.log_softmax(hf_model(torch.tensor([prompt + got])).logits[0].double(), -1)
        for j, tok in enumerate(got):
            row = ref[len(prompt) - 1 + j]
            assert row[tok] >= row.max() - 1e-4, (j, tok, int(row.argmax()))
            assert abs(out.outputs[0].logprobs[j][tok].logprob - row[tok].item()) < 1e-4


def test_bf16_checkpoint_matches_hf(tmp_path) -> None:
    """A bfloat16 Mixtral checkpoint, both sides computing in float32 from the same bf16
    weights."""
    path = save_random_model(
        str(tmp_path / "bf16"),
        "tiny-mixtral",
        seed=3,
        tokenizer=False,
        vocab_size=VOCAB,
        dtype=torch.bfloat16,
    )
    model, _ = load_model(path, torch.float32, "cpu")
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.randint(0, VOCAB, (21,), generator=torch.Generator().manual_seed(2))
    logits = model.compute_logits(model(ids, torch.arange(21), DenseAttentionBackend([0, 21])))
    with torch.no_grad():
        want = ref(ids[None]).logits[0].double()
    assert float((logits.double() - want).abs().max() / want.abs().max()) < 1e-4


def test_stacked_expert_checkpoint(tmp_path) -> None:
    """Experts stored stacked, as transformers 5 holds them (mlp.experts.gate_up_proj
    [E, 2I, H], mlp.experts.down_proj [E, H, I]), load like the per-expert layout."""
    from safetensors.torch import load_file, save_file

    path = save_random_model(
        str(tmp_path / "m"), "tiny-qwen2-moe", seed=4, tokenizer=False, vocab_size=VOCAB
    )
    per_expert, _ = load_model(path, torch.float32, "cpu")
    tensors = load_file(f"{path}/model.safetensors")
    for layer in range(2):
        p = f"model.layers.{layer}.mlp.experts."
        e = [p + f"{i}." for i in range(4)]
        gate_up = [
            torch.cat([tensors.pop(x + "gate_proj.weight"), tensors.pop(x + "up_proj.weight")])
            for x in e
        ]
        tensors[p + "gate_up_proj"] = torch.stack(gate_up)
        tensors[p + "down_proj"] = torch.stack([tensors.pop(x + "down_proj.weight") for x in e])
    save_file(tensors, f"{path}/model.safetensors")
    stacked, _ = load_model(path, torch.float32, "cpu")
    for a, b in zip(per_expert.parameters(), stacked.parameters()):
        assert torch.equal(a, b)
