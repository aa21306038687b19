"""LoRA adapters made with peft on a tiny random Llama: pagedkv's model with the adapters in
device slots gives the logits of the PEFT-merged HF model for each adapter, also with both
adapters and the base model in one batch, and when adapters swap through fewer slots."""

from __future__ import annotations

import pytest
from support.deps import need
from support.peft_adapters import save_peft_adapter

torch = need("torch")
transformers = need("transformers")
peft = need("peft")

from pagedkv.lora import LoRARequest  # noqa: E402
from pagedkv.lora.manager import LoRAManager  # noqa: E402
from pagedkv.models import load_model  # noqa: E402
from pagedkv.models.reference_backend import DenseAttentionBackend  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

VOCAB = 256
TARGETS = [
    ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    ["q_proj", "v_proj", "down_proj"],
]


def _make_adapter(base: str, out: str, seed: int, rank: int, targets: list[str]) -> None:
    save_peft_adapter(base, out, targets, seed, rank, lora_alpha=2 * rank + 1)


def _merged(base: str, adapter: str):
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    return peft.PeftModel.from_pretrained(model, adapter).merge_and_unload().eval()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora")
    base = save_random_model(
        str(d / "base"), "tiny-llama", seed=3, tokenizer=False, vocab_size=VOCAB
    )
    adapters = [str(d / "a1"), str(d / "a2")]
    _make_adapter(base, adapters[0], 1, 8, TARGETS[0])
    _make_adapter(base, adapters[1], 2, 4, TARGETS[1])
    refs = [transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()]
    refs += [_merged(base, a) for a in adapters]
    return base, adapters, refs


def _run(model, manager, seqs, ids):
    loc = [0]
    for s in seqs:
        loc.append(loc[-1] + len(s))
    tokens = torch.cat(seqs)
    positions = torch.cat([torch.arange(len(s)) for s in seqs])
    manager.prepare_step([i for s, i in zip(seqs, ids) for _ in range(len(s))])
    try:
        return model.compute_logits(model(tokens, positions, DenseAttentionBackend(loc))), loc
    finally:
        manager.end_step()


@pytest.mark.parametrize(
    "max_loras,kernel",
    [(2, "auto"), (1, "auto"), (2, "grouped_mm"), (1, "grouped_mm"), (2, "dense"), (1, "dense")],
)
def test_logits_equal_peft_merged(setup, max_loras: int, kernel: str) -> None:
    if kernel == "grouped_mm" and not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no torch._grouped_mm")
    base, adapters, refs = setup
    model, _ = load_model(base, torch.float32, "cpu")
    manager = LoRAManager(
        model, max_loras=max_loras, max_lora_rank=8, max_cpu_loras=2, kernel=kernel
    )
    for i, path in enumerate(adapters, start=1):
        manager.add_adapter(LoRARequest(f"a{i}", i, path))
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, VOCAB, (n,), generator=g) for n in (5, 9, 3, 7)]
    # both adapters and the base model in one batch when two slots exist; else one at a time
    batches = [[0, 1, 2, 1]] if max_loras == 2 else [[1, 0, 1, 0], [2, 2, 0, 0], [1, 1, 1, 1]]
    for ids in batches:
        logits, loc = _run(model, manager, seqs, ids)
        with torch.no_grad():
            for k, (s, a) in enumerate(zip(seqs, ids)):
                want = refs[a](s[None]).logits[0]
                got = logits[loc[k] : loc[k + 1]]
                err = float((got - want).abs().max() / want.abs().max())
                assert err < 1e-4, (ids, k, err)
    # the adapters really change the model's output
    assert not torch.allclose(refs[0](seqs[0][None]).logits, refs[1](seqs[0][None]).logits)


def test_refusals(setup, tmp_path) -> None:
    base, adapters, _ = setup
    model, _ = load_model(base, torch.float32, "cpu")
    manager = LoRAManager(model, max_loras=1, max_lora_rank=4)
    with pytest.raises(ValueError, match="rank 8, but max_lora_rank is 4"):
        manager.add_adapter(LoRARequest("a1", 1, adapters[0]))
    with pytest.raises(ValueError, match="no adapter_config.json"):
        manager.add_adapter(LoRARequest("x", 3, str(tmp_path)))
    manager.add_adapter(LoRARequest("a2", 2, adapters[1]))
    with pytest.raises(ValueError, match="not loaded"):
        manager.prepare_step([5])
