"""The engine's decode plans (engine/decode_plans.StepPlans) through PagedAttentionBackend on
the CPU: a decode step whose rows share prefix blocks runs the cascade, a skewed one the
balanced plan, and both give the partition split's output; the shared-prefix rule."""

from __future__ import annotations

import numpy as np
import pytest
from support.deps import need

torch = need("torch")

from pagedkv.cascade import shared_prefix_blocks  # noqa: E402
from pagedkv.engine.decode_plans import StepPlans  # noqa: E402
from pagedkv.engine.paged_backend import AttentionMetadata, PagedAttentionBackend  # noqa: E402
from pagedkv.models.attention_backend import AttentionSpec  # noqa: E402

KVH, H, D, BS = 2, 8, 64, 16


def _step(tables: np.ndarray, lens: list[int], kv: torch.Tensor, plans):
    backend = PagedAttentionBackend([kv], H, KVH, D, BS, "auto", plans)
    n = len(lens)
    meta = AttentionMetadata(
        num_prefills=0,
        num_prefill_tokens=0,
        num_decode_tokens=n,
        slot_mapping=torch.full((n,), -1, dtype=torch.int64),  # nothing new written
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        query_start_loc=torch.zeros(1, dtype=torch.int32),
        block_tables=torch.from_numpy(tables),
        max_query_len=1,
        max_decode_seq_len=max(lens),
    )
    if plans is not None:
        plans.begin_step(np.array(lens), tables, BS)
    backend.set_metadata(meta)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(n, H, D, generator=g)
    kv_new = torch.zeros(n, KVH, D)
    return backend.forward(0, q, kv_new, kv_new, AttentionSpec.default(D))


@pytest.mark.parametrize("shared", [True, False])
def test_step_plans_match_the_partition_split(shared: bool) -> None:
    rng = np.random.default_rng(0)
    nblk = 80
    kv = torch.randn(2, nblk, BS, KVH, D, generator=torch.Generator().manual_seed(1))
    lens = [530, 40, 49, 33, 61, 17] if not shared else [320 + x for x in (5, 30, 1, 17, 9, 64)]
    perm = rng.permutation(nblk).astype(np.int32)
    tables = np.zeros((len(lens), 40), np.int32)
    pos = 0
    for i, n in enumerate(lens):
        need = -(-n // BS)
        first = 20 if shared else 0  # shared: 20 common blocks (320 keys), then own blocks
        tables[i, :first] = perm[:20][:first]
        own = need - first
        tables[i, first:need] = perm[20 + pos : 20 + pos + own]
        pos += own
    plans = StepPlans(8, H, D, target_items=6, device="cpu")
    got = _step(tables, lens, kv, plans)
    want = _step(tables, lens, kv, None)
    assert torch.allclose(got, want, atol=2e-6, rtol=1e-5)
    if shared:
        assert plans.cascade_layers == 1 and plans.balanced_layers == 0
    else:
        assert plans.balanced_layers == 1 and plans.cascade_layers == 0


def test_shared_prefix_rule() -> None:
    t = np.array([[5, 6, 7, 8], [5, 6, 9, 10], [5, 6, 7, 11], [5, 6, 12, 13]], np.int32)
    assert shared_prefix_blocks([64, 64, 64, 64], t, 16) == 2  # 2 of 4 blocks: half the reads
    assert shared_prefix_blocks([64, 64, 64], t[:3], 16) == 0  # fewer than 4 sequences
    assert shared_prefix_blocks([20, 64, 64, 64], t, 16) == 0  # a sequence fills only block 0
    assert shared_prefix_blocks([64, 64, 64, 640], t, 16) == 0  # the prefix is a small share


def test_graph_plans_fall_back_to_one_item_per_sequence() -> None:
    """Graphs captured on the balanced path (graphs="balanced"): before each replay, "auto"
    keeps the pieces of a skewed batch and gives a uniform one one item per sequence (the single
    pass's work on the same launch); padding rows get no items."""
    plans = StepPlans(8, H, D, target_items=6, device="cpu", graphs="balanced")
    plan = plans.plan(0)
    plans.fill_all([900, 30, 20, 10], rows=6)
    assert plan.used > 4 and plan.longest_piece() < 900
    # Pieces of 160 keys would not halve 300-key sequences: one item per sequence.
    plans.fill_all([300, 300, 300, 300], rows=6)
    assert plan.used == 4 and plan.longest_piece() == 300
    offsets = plan.offsets_host.numpy()
    assert (offsets[5:] == 4).all()  # rows 4 and 5 (padding): no items
