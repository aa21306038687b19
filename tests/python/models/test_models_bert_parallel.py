"""BERT-family encoders on real process groups (gloo, CPU): a tiny random XLM-R cross-encoder
sharded over 2 ranks by tensors (heads, MLP columns, vocabulary) gives the hidden states and
logits of the unsharded model, each rank holding only its shard; pipeline stages are refused by
name."""

from __future__ import annotations

import socket

import pytest
from support.deps import need

torch = need("torch")
need("transformers")

from pagedkv.models import load_model  # noqa: E402
from pagedkv.models.reference_backend import DenseAttentionBackend  # noqa: E402
from pagedkv.testing import save_random_encoder  # noqa: E402

LENGTHS = [7, 12, 3]


def _inputs(vocab: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    g = torch.Generator().manual_seed(7)
    seqs = [torch.randint(3, vocab, (n,), generator=g) for n in LENGTHS]
    loc = [0]
    for s in seqs:
        loc.append(loc[-1] + len(s))
    return torch.cat(seqs), torch.cat([torch.arange(len(s)) for s in seqs]), loc


def _forward(model, cfg) -> dict:  # noqa: ANN001
    ids, pos, loc = _inputs(cfg.vocab_size)
    hidden = model(ids, pos, DenseAttentionBackend(loc))
    return {"hidden": hidden, "logits": model.classify(hidden[loc[:-1]])}


def _rank_main(rank: int, path: str, tp: int, port: int, out: str) -> None:
    from pagedkv.distributed import (
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )

    torch.set_num_threads(1)
    init_distributed_environment(tp, rank, "gloo", f"tcp://127.0.0.1:{port}", timeout_s=60)
    initialize_model_parallel(tp, 1, torch.device("cpu"))
    try:
        model, cfg = load_model(path, torch.float32, "cpu")
        result = _forward(model, cfg)
        result["params"] = sum(p.numel() for p in model.parameters())
        torch.save(result, f"{out}.{rank}")
    finally:
        destroy_model_parallel()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tensor_parallel_encoder_matches_unsharded(tmp_path) -> None:
    path = save_random_encoder(str(tmp_path / "xlmr"), "xlm-roberta", num_labels=2, seed=4)
    model, cfg = load_model(path, torch.float32, "cpu")
    expected = _forward(model, cfg)
    full = sum(p.numel() for p in model.parameters())
    out = str(tmp_path / "tp")
    torch.multiprocessing.spawn(_rank_main, args=(path, 2, _free_port(), out), nprocs=2, join=True)
    for rank in range(2):
        got = torch.load(f"{out}.{rank}")
        torch.testing.assert_close(got["hidden"], expected["hidden"], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got["logits"], expected["logits"], rtol=1e-4, atol=1e-4)
        assert got["params"] < 0.8 * full, (got["params"], full)


def test_pipeline_parallel_is_refused(tmp_path, monkeypatch) -> None:
    import pagedkv.models.bert as bert

    path = save_random_encoder(str(tmp_path / "bert"), "bert", seed=4)
    monkeypatch.setattr(bert, "is_last_stage", lambda: False)  # a first stage of two
    with pytest.raises(ValueError, match="BertModel does not support pipeline parallelism"):
        load_model(path, torch.float32, "cpu")
