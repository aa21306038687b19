"""BERT-family encoders (models/bert.py) against HF transformers on tiny random checkpoints that
transformers itself wrote (pagedkv.testing.save_random_encoder: non-zero biases and LayerNorm
weights, a real tokenizer): the final hidden states of text and text-pair inputs, run through the
paged KV cache and the non-causal prefill op, and the cross-encoder heads' logits, in float32."""

from __future__ import annotations

import pytest
from support.deps import need

torch = need("torch")
transformers = need("transformers")

from pagedkv.engine.paged_backend import AttentionMetadata, PagedAttentionBackend  # noqa: E402
from pagedkv.models import load_model  # noqa: E402
from pagedkv.models.bert import roberta_positions  # noqa: E402
from pagedkv.models.config import ModelConfig  # noqa: E402
from pagedkv.models.reference_backend import DenseAttentionBackend  # noqa: E402
from pagedkv.testing import save_random_encoder  # noqa: E402

TEXTS = [
    ("hello world", None),
    ("what is the capital of france?", None),
    ("what is it", "a cat sat on the mat"),
    ("paris", "paris is the capital and a big city on a river"),
]
BLOCK = 16


def paged_forward(model, cfg: ModelConfig, seqs, types) -> list[torch.Tensor]:
    """A minimal step driver: the sequences laid end to end in one prefill over a paged NHD
    cache (blocks handed out in reverse, unused slots NaN so a stray read shows), through the
    engine's PagedAttentionBackend. Returns each sequence's hidden states."""
    lens = [len(s) for s in seqs]
    need_blocks = [(n + BLOCK - 1) // BLOCK for n in lens]
    num_blocks = sum(need_blocks) + 2
    caches = [
        torch.full((2, num_blocks, BLOCK, cfg.num_key_value_heads, cfg.head_dim), float("nan"))
        for _ in range(cfg.num_hidden_layers)
    ]
    free = list(range(num_blocks))[::-1]
    tables = torch.zeros(len(seqs), max(need_blocks), dtype=torch.int32)
    slots = []
    for i, n in enumerate(lens):
        for b in range(need_blocks[i]):
            tables[i, b] = free.pop()
        slots += [int(tables[i, t // BLOCK]) * BLOCK + t % BLOCK for t in range(n)]
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    backend = PagedAttentionBackend(
        caches, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, BLOCK
    )
    backend.set_metadata(
        AttentionMetadata(
            num_prefills=len(seqs),
            num_prefill_tokens=sum(lens),
            num_decode_tokens=0,
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            seq_lens=torch.tensor(lens, dtype=torch.int32),
            query_start_loc=qsl,
            block_tables=tables,
            max_query_len=max(lens),
            max_decode_seq_len=0,
        )
    )
    ids = torch.tensor([t for s in seqs for t in s])
    positions = torch.cat([torch.arange(n) for n in lens])
    token_types = torch.tensor([t for s in types for t in s])
    hidden = model(ids, positions, backend, token_type_ids=token_types)
    return list(hidden.split(lens))


def _encode(path: str, texts=TEXTS):
    tok = transformers.AutoTokenizer.from_pretrained(path)
    encs = [tok(a, b) if b is not None else tok(a) for a, b in texts]
    seqs = [e["input_ids"] for e in encs]
    types = [e.get("token_type_ids") or [0] * len(e["input_ids"]) for e in encs]
    return seqs, types


def _hf(cls_name: str, path: str):
    return getattr(transformers, cls_name).from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("kind", ["bert", "xlm-roberta"])
def test_hidden_states_equal_hf(kind: str, tmp_path) -> None:
    path = save_random_encoder(str(tmp_path / kind), kind, seed=11)
    model, cfg = load_model(path, torch.float32, "cpu")
    assert cfg.is_encoder and not cfg.attention_spec(0).causal
    assert model.pooling_type == "CLS" and not model.is_causal  # read by the pooling engine
    seqs, types = _encode(path)
    if kind == "bert":
        assert any(1 in t for t in types)  # the pairs carry segment B
    else:  # a pad token inside a sequence: RoBERTa numbers positions around it
        pad = cfg.extra["pad_token_id"]
        seqs.append([0, 7, pad, 9, pad, 12, 2])
        types.append([0] * 7)
    hf = _hf("BertModel" if kind == "bert" else "XLMRobertaModel", path)
    got = paged_forward(model, cfg, seqs, types)
    for s, t, h in zip(seqs, types, got):
        with torch.no_grad():
            want = hf(
                input_ids=torch.tensor([s]), token_type_ids=torch.tensor([t])
            ).last_hidden_state[0]
        assert (h - want).abs().max().item() <= 1e-4
        # The torch reference backend honours AttentionSpec.causal too.
        dense = model(torch.tensor(s), torch.arange(len(s)), DenseAttentionBackend(), None,
                      torch.tensor(t))  # fmt: skip
        assert (dense - want).abs().max().item() <= 1e-4
    # RoBERTa's positions start at pad_token_id + 1: fewer tokens fit than the table's rows.
    offset = 0 if kind == "bert" else cfg.extra["pad_token_id"] + 1
    assert cfg.derived_max_model_len() == cfg.max_position_embeddings - offset
    # Non-causal for real: the first token of a sequence changes with a later token.
    s0 = list(seqs[1])
    s1 = s0[:-2] + [s0[-3], s0[-1]]
    a, b = paged_forward(model, cfg, [s0, s1], [[0] * len(s0), [0] * len(s1)])
    assert (a[0] - b[0]).abs().max().item() > 1e-3


@pytest.mark.parametrize("kind", ["bert", "roberta", "xlm-roberta"])
def test_cross_encoder_logits_equal_hf(kind: str, tmp_path) -> None:
    path = save_random_encoder(str(tmp_path / kind), kind, num_labels=3, seed=5)
    model, cfg = load_model(path, torch.float32, "cpu")
    assert cfg.is_classifier and cfg.num_labels == 3
    seqs, types = _encode(path)
    hidden = paged_forward(model, cfg, seqs, types)
    first = torch.stack([h[0] for h in hidden])
    logits = model.classify(first)
    hf = _hf(transformers.AutoConfig.from_pretrained(path).architectures[0], path)
    for i, (s, t) in enumerate(zip(seqs, types)):
        with torch.no_grad():
            want = hf(input_ids=torch.tensor([s]), token_type_ids=torch.tensor([t])).logits[0]
        assert (logits[i] - want).abs().max().item() <= 1e-4
    assert logits.dtype == torch.float32 and logits.shape == (len(seqs), 3)


def test_roberta_positions_restart_per_sequence() -> None:
    pad = 1
    ids = torch.tensor([0, 5, 1, 6, 2, 0, 1, 1, 7])  # two sequences: 5 and 4 tokens
    positions = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 3])
    want = [2, 3, 1, 4, 5, 2, 1, 1, 3]  # HF: cumsum of non-pad * mask + pad, per sequence
    assert roberta_positions(ids, positions, pad).tolist() == want


def test_encoders_refuse_generation_and_unsupported_configs(tmp_path) -> None:
    from pagedkv.engine.engine_setup import check_servable

    path = save_random_encoder(str(tmp_path / "bert"), "bert")
    model, cfg = load_model(path, torch.float32, "cpu")
    with pytest.raises(ValueError, match="BertModel is an encoder model"):
        model.compute_logits(torch.zeros(1, cfg.hidden_size))
    with pytest.raises(ValueError, match="BertModel is an encoder model"):
        check_servable(cfg)
    with pytest.raises(ValueError, match="no classification head"):
        model.classify(torch.zeros(1, cfg.hidden_size))
    d = transformers.BertConfig(architectures=["BertModel"]).to_dict()
    with pytest.raises(ValueError, match="position_embedding_type 'relative_key'"):
        ModelConfig.from_hf_dict({**d, "position_embedding_type": "relative_key"})
    with pytest.raises(ValueError, match="is_decoder"):
        ModelConfig.from_hf_dict({**d, "is_decoder": True})
