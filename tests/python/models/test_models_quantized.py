"""Quantized checkpoints (fp8 per tensor / per channel, AWQ and GPTQ int4) of tiny random
models, quantised in the test (support.quantize, from the formats' documented layouts): pagedkv
on the quantized checkpoint must give the logits, greedy tokens and logprobs of HF transformers
on the dequantised float checkpoint (float32, CPU). Unsupported methods and options are refused
by name."""

from __future__ import annotations

import json
import os

import pytest
from support.deps import need
from support.quantize import quantize_checkpoint

torch = need("torch")
transformers = need("transformers")

from pagedkv import LLM, SamplingParams  # noqa: E402
from pagedkv.models import load_model  # noqa: E402
from pagedkv.models.reference_backend import DenseAttentionBackend  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 512
CASES = {
    "fp8-per-tensor": ("fp8", {}),
    "fp8-per-channel": ("fp8", {"per_channel": True}),
    "awq-g32": ("awq", {"group_size": 32}),
    "gptq-g16": ("gptq", {"group_size": 16}),
}


@pytest.fixture(scope="module")
def float_model(tmp_path_factory) -> str:
    # Qwen2: q/k/v biases stay float beside the quantized weights; head_dim 32 (kernels).
    out = str(tmp_path_factory.mktemp("float"))
    return save_random_model(
        out,
        "tiny-qwen2",
        seed=5,
        tokenizer=False,
        vocab_size=VOCAB,
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
    )


def _quantize(float_model: str, tmp_path, method: str, **kw) -> tuple[str, str]:
    dst, ref = str(tmp_path / "quant"), str(tmp_path / "ref")
    quantize_checkpoint(float_model, dst, ref, method, **kw)
    return dst, ref


@pytest.mark.parametrize("case", sorted(CASES))
def test_quantized_matches_dequantized_hf(case: str, float_model: str, tmp_path) -> None:
    method, kw = CASES[case]
    path, ref_path = _quantize(float_model, tmp_path, method, **kw)
    model, config = load_model(path, torch.float32, "cpu")
    assert config.quantization_config["quant_method"] == method
    ref = transformers.AutoModelForCausalLM.from_pretrained(ref_path, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, VOCAB, (n,), generator=g) for n in (3, 20)]
    loc = [0, 3, 23]
    positions = torch.cat([torch.arange(len(s)) for s in seqs])
    logits = model.compute_logits(model(torch.cat(seqs), positions, DenseAttentionBackend(loc)))
    with torch.no_grad():
        for i, s in enumerate(seqs):
            want = ref(s[None]).logits[0].double()
            err = (logits[loc[i] : loc[i + 1]].double() - want).abs().max() / want.abs().max()
            assert float(err) < 1e-4, (case, float(err))

    # The engine: greedy tokens are HF's choices, logprobs within 1e-4.
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (4, 9, 17)]
    llm = LLM(
        path, skip_tokenizer_init=True, device="cpu", dtype="float32", seed=0, kv_cache_space=0.01
    )
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0.0, max_tokens=16, logprobs=0, ignore_eos=True),
    )
    for prompt, out in zip(prompts, outs):
        got = list(out.outputs[0].token_ids)
        with torch.no_grad():
            rows = torch.log_softmax(ref(torch.tensor([prompt + got])).logits[0].double(), -1)
        for j, tok in enumerate(got):
            row = rows[len(prompt) - 1 + j]
            assert row[tok] >= row.max() - 1e-4
            assert abs(out.outputs[0].logprobs[j][tok].logprob - row[tok].item()) < 1e-4


def test_online_fp8_matches_per_channel_checkpoint(float_model: str, tmp_path) -> None:
    """LLM(quantization="fp8") on a float checkpoint = its per-channel fp8 quantisation."""
    _, ref_path = _quantize(float_model, tmp_path, "fp8", per_channel=True)
    online, _ = load_model(float_model, torch.float32, "cpu", quantization="fp8")
    ref, _ = load_model(ref_path, torch.float32, "cpu")
    ids = torch.randint(0, VOCAB, (12,))
    a = online.compute_logits(online(ids, torch.arange(12), DenseAttentionBackend()))
    b = ref.compute_logits(ref(ids, torch.arange(12), DenseAttentionBackend()))
    assert float((a - b).abs().max() / b.abs().max()) < 1e-5


def _edit_quant_config(path: str, **changes) -> None:
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["quantization_config"].update(changes)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"quant_method": "bitsandbytes"}, "quantization method 'bitsandbytes' is not supported"),
        ({"bits": 8}, "gptq with bits=8 is not supported"),
        ({"checkpoint_format": "marlin"}, "checkpoint_format 'marlin'"),
    ],
)
def test_unsupported_gptq_variants_are_refused(
    float_model: str, tmp_path, changes, message
) -> None:
    path, _ = _quantize(float_model, tmp_path, "gptq", group_size=16)
    _edit_quant_config(path, **changes)
    with pytest.raises(ValueError, match=message):
        load_model(path, torch.float32, "cpu")


def test_desc_act_order_is_refused(float_model: str, tmp_path) -> None:
    perm = torch.randperm(64) // 16  # a g_idx out of plain order (desc_act=True)
    path, _ = _quantize(
        float_model, tmp_path, "gptq", group_size=16, g_idx=perm, extra_config={"desc_act": True}
    )
    with pytest.raises(ValueError, match="desc_act"):
        load_model(path, torch.float32, "cpu")


def test_refusals(float_model: str, tmp_path) -> None:
    path, _ = _quantize(float_model, tmp_path, "fp8")
    with pytest.raises(ValueError, match="does not match"):
        load_model(path, torch.float32, "cpu", quantization="awq")
    _edit_quant_config(path, activation_scheme="static")
    with pytest.raises(ValueError, match="activation_scheme 'static'"):
        load_model(path, torch.float32, "cpu")
    with pytest.raises(ValueError, match="needs a checkpoint quantized with gptq"):
        load_model(float_model, torch.float32, "cpu", quantization="gptq")
    with pytest.raises(ValueError, match="quantization method 'squeezellm'"):
        LLM(float_model, skip_tokenizer_init=True, device="cpu", quantization="squeezellm")
