"""The engine's decode plans (engine/decode_plans.StepPlans) through PagedAttentionBackend on
the CPU: a decode step whose rows share prefix blocks runs the cascade, a skewed one the
balanced plan, and both give the partition split's output; the shared-prefix rule; the cascade
as a CUDA graph replays it (fixed buffers captured once per batch size, refilled per step while
requests finish), run eagerly here on the same buffers."""

from __future__ import annotations

import numpy as np
import pytest
from support.deps import need
from support.paged_cases import shared_prefix_tables

torch = need("torch")

from pagedkv.cascade import CascadeDecode, shared_prefix_blocks  # noqa: E402
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
    plans = _plans(kv, max_seqs=8, max_blocks=40)
    got = _step(tables, lens, kv, plans)
    want = _step(tables, lens, kv, None)
    assert torch.allclose(got, want, atol=2e-6, rtol=1e-5)
    if shared:
        assert plans.cascade_layers == 1 and plans.balanced_layers == 0
    else:
        assert plans.balanced_layers == 1 and plans.cascade_layers == 0


def _plans(kv: torch.Tensor, max_seqs: int, max_blocks: int, **kw) -> StepPlans:
    """CPU plans as the engine makes them: the balanced ones and the cascade."""
    rows = torch.empty(max_seqs, H, D)
    cascade = CascadeDecode(rows, kv[0], kv[1], KVH)
    return StepPlans(
        max_seqs, H, D, target_items=6, device="cpu", cascade=cascade, max_blocks=max_blocks, **kw
    )


def test_shared_prefix_rule() -> None:
    t = np.array([[5, 6, 7, 8], [5, 6, 9, 10], [5, 6, 7, 11], [5, 6, 12, 13]], np.int32)
    assert shared_prefix_blocks([512, 512, 512, 512], t, 128) == 2  # half the reads
    assert shared_prefix_blocks([512, 512, 512], t[:3], 128) == 0  # fewer than 4 sequences
    assert shared_prefix_blocks([200, 512, 512, 512], t, 128) == 0  # a sequence fills block 0 only
    assert shared_prefix_blocks([512, 512, 512, 5120], t, 128) == 0  # the prefix: a small share
    assert shared_prefix_blocks([64, 64, 64, 64], t, 16) == 0  # 32 keys: under the 256 floor
    t16 = np.tile(np.arange(20, dtype=np.int32), (4, 1))
    assert shared_prefix_blocks([300] * 4, t16, 16) == 18  # 18 whole blocks: 288 keys


def test_graph_plans_fall_back_to_one_item_per_sequence() -> None:
    """Graphs captured on the balanced path (graphs="balanced"): before each replay, "auto"
    keeps the pieces of a skewed batch and gives a uniform one one item per sequence (the single
    pass's work on the same launch); padding rows get no items."""
    plans = StepPlans(8, H, D, target_items=6, device="cpu", graphs="balanced")  # no cascade
    plan = plans.plan(0)
    plans.fill_all([900, 30, 20, 10], rows=6)
    assert plan.used > 4 and plan.longest_piece() < 900
    # Pieces of 160 keys would not halve 300-key sequences: one item per sequence.
    plans.fill_all([300, 300, 300, 300], rows=6)
    assert plan.used == 4 and plan.longest_piece() == 300
    offsets = plan.offsets_host.numpy()
    assert (offsets[5:] == 4).all()  # rows 4 and 5 (padding): no items


def _tables(rng, shared: int, lens: list[int], nblk: int) -> np.ndarray:
    return shared_prefix_tables(rng, shared, lens, nblk, 40, BS)


class _GraphLike:
    """The CUDA graph runner's view of a cascade graph for ``bs`` rows, run eagerly: static
    metadata buffers (padding rows: one key, slot -1), the plans' capture made once, then per
    step the buffers refilled (CudaGraphRunner.run's order) and the same backend forward."""

    def __init__(self, kv: torch.Tensor, plans: StepPlans, bs: int, max_len: int) -> None:
        self.plans, self.bs, self.kv = plans, bs, kv
        self.seq_lens = torch.ones(bs, dtype=torch.int32)
        self.block_tables = torch.zeros(bs, 40, dtype=torch.int32)
        plans.begin_capture(bs, cascade=True)
        self.backend = PagedAttentionBackend([kv], H, KVH, D, BS, "auto", plans)
        self.backend.set_metadata(
            AttentionMetadata(
                num_prefills=0,
                num_prefill_tokens=0,
                num_decode_tokens=bs,
                slot_mapping=torch.full((bs,), -1, dtype=torch.int64),
                seq_lens=self.seq_lens,
                query_start_loc=torch.zeros(1, dtype=torch.int32),
                block_tables=self.block_tables,
                max_query_len=1,
                max_decode_seq_len=max_len,
            )
        )
        self.q = torch.zeros(bs, H, D)

    def replay(self, tables: np.ndarray, lens: list[int], q: torch.Tensor) -> torch.Tensor:
        n = len(lens)
        self.seq_lens[:n], self.seq_lens[n:] = torch.tensor(lens, dtype=torch.int32), 1
        self.block_tables[:n] = torch.from_numpy(tables)
        self.q[:n], self.q[n:] = q, 0
        assert self.plans.fill_cascade(np.array(lens), tables, self.bs)
        kv_new = torch.zeros(self.bs, KVH, D)
        out = self.backend.forward(0, self.q, kv_new, kv_new, AttentionSpec.default(D))
        return out[:n]


def test_graph_cascade_refills_across_steps() -> None:
    """One "captured" cascade of 8 rows replayed over steps whose rows finish (8 -> 6 -> 4
    sequences), whose own lengths grow and differ, and whose shared prefix changes: each
    replay gives the plain decode's output; a step below the rule's rows or without a shared
    prefix is refused (the plain graph replays it)."""
    rng = np.random.default_rng(5)
    nblk = 160
    kv = torch.randn(2, nblk, BS, KVH, D, generator=torch.Generator().manual_seed(2))
    plans = _plans(kv, max_seqs=8, max_blocks=40)
    graph = _GraphLike(kv, plans, bs=8, max_len=40 * BS)
    steps = [
        (17, [272 + x for x in (1, 5, 17, 30, 2, 9, 33, 16)]),
        (17, [272 + x for x in (2, 6, 18, 31, 3, 10)]),  # two requests finished
        (17, [272 + x for x in (7, 19, 32, 4)]),
        (16, [256 + x for x in (40, 3, 77, 21, 5)]),  # another prompt: 16 shared blocks
    ]
    for shared, lens in steps:
        tables = _tables(rng, shared, lens, nblk)
        q = torch.randn(len(lens), H, D, generator=torch.Generator().manual_seed(len(lens)))
        got = graph.replay(tables, lens, q)
        want = _plain(kv, tables, lens, q)
        assert torch.allclose(got, want, atol=2e-6, rtol=1e-5), (shared, lens)
    assert plans.cascade_layers == 0  # graph replays: no eager cascade calls
    lens3 = [300, 310, 320]
    assert not plans.fill_cascade(np.array(lens3), _tables(rng, 17, lens3, nblk), 8)
    lens4 = [300, 310, 320, 330]
    assert not plans.fill_cascade(np.array(lens4), _tables(rng, 0, lens4, nblk), 8)


def _plain(kv: torch.Tensor, tables: np.ndarray, lens: list[int], q: torch.Tensor):
    """The partition split's decode of ``q`` (no plans)."""
    backend = PagedAttentionBackend([kv], H, KVH, D, BS, "auto", None)
    n = len(lens)
    backend.set_metadata(
        AttentionMetadata(
            num_prefills=0,
            num_prefill_tokens=0,
            num_decode_tokens=n,
            slot_mapping=torch.full((n,), -1, dtype=torch.int64),
            seq_lens=torch.tensor(lens, dtype=torch.int32),
            query_start_loc=torch.zeros(1, dtype=torch.int32),
            block_tables=torch.from_numpy(tables),
            max_query_len=1,
            max_decode_seq_len=max(lens),
        )
    )
    kv_new = torch.zeros(n, KVH, D)
    return backend.forward(0, q, kv_new, kv_new, AttentionSpec.default(D))
