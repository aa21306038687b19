"""The parallel layers on real process groups (gloo, CPU): a tiny random Llama (2 KV heads),
Qwen2 (1 KV head: replicated under TP=2, tied embeddings), Mixtral, Qwen2-MoE and DeepSeek
(experts split along their intermediate dimension, shared experts; DeepSeek's MLA heads)
sharded over 2 ranks, by tensors (TP=2) or by layers (PP=2, hidden states sent between the
stages), must give the logits of the unsharded model, each rank having loaded only its
shard."""

from __future__ import annotations

import os
import socket

import pytest
from support.deps import need

torch = need("torch")

from pagedkv.models import load_model  # noqa: E402
from pagedkv.models.reference_backend import DenseAttentionBackend  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

VOCAB = 250  # not a multiple of 2 x 64: the vocab-parallel layers pad
LENGTHS = [5, 11, 3]


def _inputs() -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    g = torch.Generator().manual_seed(7)
    seqs = [torch.randint(0, VOCAB, (n,), generator=g) for n in LENGTHS]
    loc = [0]
    for s in seqs:
        loc.append(loc[-1] + len(s))
    return torch.cat(seqs), torch.cat([torch.arange(len(s)) for s in seqs]), loc


def _rank_main(rank: int, path: str, tp: int, pp: int, port: int, out: str) -> None:
    from pagedkv.distributed import (
        destroy_model_parallel,
        get_pp_group,
        init_distributed_environment,
        initialize_model_parallel,
    )

    torch.set_num_threads(1)
    init_distributed_environment(tp * pp, rank, "gloo", f"tcp://127.0.0.1:{port}", timeout_s=60)
    initialize_model_parallel(tp, pp, torch.device("cpu"))
    try:
        model, cfg = load_model(path, torch.float32, "cpu")
        n_params = sum(p.numel() for p in model.parameters())
        ids, pos, loc = _inputs()
        attn = DenseAttentionBackend(loc)
        group = get_pp_group()
        hidden = None
        if not group.is_first_rank:
            hidden = group.recv((len(ids), cfg.hidden_size), torch.float32, group.rank_in_group - 1)
        hidden = model(ids, pos, attn, hidden) if hidden is not None else model(ids, pos, attn)
        if not group.is_last_rank:
            group.send(hidden, group.rank_in_group + 1)
        else:
            torch.save(
                {"logits": model.compute_logits(hidden), "params": n_params}, f"{out}.{rank}"
            )
    finally:
        destroy_model_parallel()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The other families: Phi-3's fused checkpoint tensors, Gemma 2's replicated KV head and soft
# caps, GPT-NeoX's head-interleaved q/k/v, GPT-2's Conv1D weights across two stages.
@pytest.mark.parametrize(
    "preset,tp,pp",
    [
        ("tiny-llama", 2, 1),
        ("tiny-qwen2", 2, 1),
        ("tiny-qwen2", 1, 2),
        ("tiny-phi3", 2, 1),
        ("tiny-gemma2", 2, 1),
        ("tiny-gpt-neox", 2, 1),
        ("tiny-gpt2", 1, 2),
        ("tiny-mixtral", 2, 1),
        ("tiny-qwen2-moe", 2, 1),
        ("tiny-mixtral", 1, 2),
        # MLA heads split (q_b_proj / kv_b_proj by heads, o_proj by rows; the latent replicated).
        ("tiny-deepseek-v3", 2, 1),
        ("tiny-deepseek-v2", 1, 2),
    ],
)
def test_sharded_logits_match_unsharded(preset: str, tp: int, pp: int, tmp_path) -> None:
    bias = {"attention_bias": True} if preset == "tiny-llama" else {}
    path = save_random_model(
        str(tmp_path / preset), preset, seed=3, tokenizer=False, vocab_size=VOCAB, **bias
    )
    model, _ = load_model(path, torch.float32, "cpu")
    ids, pos, loc = _inputs()
    expected = model.compute_logits(model(ids, pos, DenseAttentionBackend(loc)))
    full_params = sum(p.numel() for p in model.parameters())
    out = str(tmp_path / "logits")
    torch.multiprocessing.spawn(
        _rank_main, args=(path, tp, pp, _free_port(), out), nprocs=tp * pp, join=True
    )
    last = range(tp * (pp - 1), tp * pp)  # the last stage's ranks hold the logits
    for rank in last:
        got = torch.load(f"{out}.{rank}")
        torch.testing.assert_close(got["logits"], expected, rtol=1e-4, atol=1e-4)
        # Each rank holds a shard: well under the whole model (norms etc. are replicated).
        assert got["params"] < 0.75 * full_params, (got["params"], full_params)
    assert not os.path.exists(f"{out}.{tp * pp}")
