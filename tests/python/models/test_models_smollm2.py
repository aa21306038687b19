"""SmolLM2-135M (the packaged Q4_1 GGUF) against HF transformers loading the same file: logits of
a batch of prompts, and greedy decoding through a growing KV cache."""

from __future__ import annotations

import os

import pytest
from support.deps import need

torch = need("torch")
transformers = need("transformers")
need("gguf")
need("accelerate")  # transformers needs it to load GGUF files

from pagedkv.engine.tokenizer import Tokenizer  # noqa: E402
from pagedkv.models import load_model  # noqa: E402
from pagedkv.models.reference_backend import (  # noqa: E402
    ContiguousCacheBackend,
    DenseAttentionBackend,
)

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived",
    "Translate to German: good morning, my friend. ->",
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Tiny matmuls: on a shared 2-core CI machine, torch's thread pool makes them ~10x slower.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def gguf_path(smollm2_gguf: str) -> str:
    return smollm2_gguf


@pytest.fixture(scope="module")
def ours(gguf_path: str):
    model, config = load_model(gguf_path, torch.float32, "cpu")
    return model, config


@pytest.fixture(scope="module")
def hf(gguf_path: str):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="module")
def tok(gguf_path: str) -> Tokenizer:
    return Tokenizer.from_pretrained(gguf_path)


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def test_config_from_gguf(ours) -> None:
    _, cfg = ours
    assert cfg.architecture == "LlamaForCausalLM"
    assert (cfg.num_hidden_layers, cfg.hidden_size) == (30, 576)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (9, 3, 64)
    assert cfg.vocab_size == 49152 and cfg.tie_word_embeddings


def test_logits_match_hf_batched(ours, hf, tok) -> None:
    model, _ = ours
    seqs = [tok.encode(p) for p in PROMPTS]
    ids = torch.tensor([t for s in seqs for t in s])
    positions = torch.cat([torch.arange(len(s)) for s in seqs])
    loc = [0]
    for s in seqs:
        loc.append(loc[-1] + len(s))
    logits = model.compute_logits(model(ids, positions, DenseAttentionBackend(loc)))
    worst = 0.0
    with torch.no_grad():
        for i, s in enumerate(seqs):
            ref = hf(torch.tensor([s])).logits[0].float()
            err = _rel_err(logits[loc[i] : loc[i + 1]], ref)
            worst = max(worst, err)
            assert logits[loc[i + 1] - 1].argmax() == ref[-1].argmax()
    print(f"max relative logits error vs HF: {worst:.2e}")
    assert worst < 1e-4


def _greedy_ours(model, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Prefill all prompts in one batch, then decode them together one token per step."""
    backend = ContiguousCacheBackend(model.config.num_hidden_layers)
    seq_ids = list(range(len(prompts)))
    outs: list[list[int]] = [[] for _ in prompts]
    ids = torch.tensor([t for p in prompts for t in p])
    positions = torch.cat([torch.arange(len(p)) for p in prompts])
    backend.begin_step(seq_ids, [len(p) for p in prompts])
    last = torch.tensor([len(p) for p in prompts]).cumsum(0) - 1
    for step in range(n):
        hidden = model(ids, positions, backend)
        nxt = model.compute_logits(hidden[last]).argmax(-1)
        for i, t in enumerate(nxt.tolist()):
            outs[i].append(t)
        ids = nxt
        positions = torch.tensor([len(p) + step for p in prompts])
        backend.begin_step(seq_ids, [1] * len(prompts))
        last = torch.arange(len(prompts))
    return outs


def test_greedy_tokens_match_hf_generate(ours, hf, tok) -> None:
    model, _ = ours
    n = 40
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "Name three colors."}], tokenize=True
    )
    prompts = [tok.encode(PROMPTS[1]), tok.encode(PROMPTS[2]), chat]
    mine = _greedy_ours(model, prompts, n)
    lengths = []
    for p, got in zip(prompts, mine):
        # HF stops at EOS (included); beyond it our tokens are not comparable.
        ref = hf.generate(
            torch.tensor([p]), max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id
        )[0, len(p) :].tolist()
        assert got[: len(ref)] == ref, (tok.decode(got), tok.decode(ref))
        lengths.append(len(ref))
    assert max(lengths) >= 32, lengths
