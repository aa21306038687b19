"""Work-balanced decode (ops.plan_balanced_decode + ops.paged_attention_balanced) on the CPU
against the float64 reference: the plan cuts every sequence into near-equal pieces, each
piece's partial lands in its workspace row, and the merge gives the full attention.

Outputs and workspaces are poisoned with NaN before the call (an element not written fails) and
unused cache slots are poisoned too (a key read past its sequence or piece fails)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pagedkv import ops
from support import reference_attention as ref
from support.deps import need
from support.paged_cases import alibi, empty_like_fw, make_paged_kv, rand_array, to_fw, to_np

torch = need("torch")


def _plan(lens: list[int], target: int, window: int | None, min_chunk: int = 32):
    cap = ops.balanced_plan_capacity(target, len(lens))
    items = np.full((cap, ops.BALANCED_ITEM_INTS), 12345, np.int32)
    offsets = np.full(len(lens) + 1, 12345, np.int32)
    used = ops.plan_balanced_decode(
        np.array(lens, np.int32), items, offsets, target, window, min_chunk
    )
    return items, offsets, used


def _run(kv, query, lens, items, offsets, fw, scale, **kw):
    s, h, d = (int(x) for x in query.shape)
    cap = items.shape[0]
    out = empty_like_fw((s, h, d), fw, kw.pop("dtype"))
    es = empty_like_fw((cap, h), fw, "float32")
    ml = empty_like_fw((cap, h), fw, "float32")
    tmp = empty_like_fw((cap, h, d), fw, "float32")
    ops.paged_attention_balanced(
        out,
        es,
        ml,
        tmp,
        query,
        kv.key_cache,
        kv.value_cache,
        kw.pop("kvh"),
        scale,
        kv.block_tables,
        to_fw(np.array(lens), fw, "int32"),
        to_fw(items, fw, "int32"),
        to_fw(offsets, fw, "int32"),
        max(lens),
        **kw,
    )
    return to_np(out)


@pytest.mark.parametrize(
    "seed, layout, fp8, fw, dtype",
    [
        (1, "nhd", "auto", "torch", "float32"),
        (2, "vllm", "auto", "numpy", "float32"),
        (3, "nhd", "fp8_e4m3", "torch", "bfloat16"),
        (4, "vllm", "fp8_e5m2", "torch", "float16"),
        (5, "nhd", "auto", "numpy", "float16"),
    ],
)
def test_balanced_matches_reference(seed: int, layout: str, fp8: str, fw: str, dtype: str) -> None:
    """Skewed lengths (one long sequence, short ones, an empty one), GQA, with and without a
    sliding window, soft cap and ALiBi."""
    rng = np.random.default_rng(seed)
    d = 128 if fp8 != "auto" and layout == "vllm" else int(rng.choice([64, 80, 128]))
    kvh, group, bs = int(rng.choice([1, 2])), int(rng.choice([1, 4, 8])), 16
    h = kvh * group
    lens = [1000, 3, 0, 170, 41]
    scales = (1.0, 1.0) if fp8 == "auto" else (0.15, 0.07)
    kv = make_paged_kv(
        rng, fw, dtype, layout, fp8, lens, bs, kvh, d, k_scale=scales[0], v_scale=scales[1]
    )
    query, q64 = rand_array(rng, (len(lens), h, d), fw, dtype)
    scale = 1.0 / math.sqrt(d)
    for features in (False, True):
        window = 300 if features else None
        cap = 20.0 if features else 0.0
        slopes, slopes64 = alibi(rng, h, fw) if features else (None, None)
        items, offsets, used = _plan(lens, target=8, window=window)
        assert used > len(lens) - 1  # the long sequence is cut into several pieces
        got = _run(
            kv,
            query,
            lens,
            items,
            offsets,
            fw,
            scale,
            dtype=dtype,
            kvh=kvh,
            alibi_slopes=slopes,
            kv_cache_dtype=fp8,
            k_scale=scales[0],
            v_scale=scales[1],
            logits_soft_cap=cap,
            sliding_window=window,
        )
        assert not np.isnan(got).any(), "output element not written"
        want = ref.decode(
            q64,
            kv.k_dense,
            kv.v_dense,
            kv.block_tables_np,
            np.array(lens),
            scale,
            alibi_slopes=slopes64,
            soft_cap=cap,
            sliding_window=window,
        )
        tol = 2e-6 if dtype == "float32" else 1e-2
        assert ref.rel_error(got, want) < tol, (seed, features)
        assert np.all(got[2] == 0.0)  # no keys: zero output, as paged_attention_v1


def test_plan_pieces_are_balanced_and_cover_every_key() -> None:
    """Zipf lengths: every piece at most the balanced share (+ one 16-key unit of rounding),
    listed longest first, each sequence's pieces in its rows in key order, unused items marked."""
    rng = np.random.default_rng(7)
    w = 1.0 / np.arange(1, 65) ** 1.5
    lens = [max(1, int(x)) for x in rng.permutation(w / w.sum() * 1024 * 64)]
    target = 49
    items, offsets, used = _plan(lens, target, None, ops.BALANCED_MIN_CHUNK)
    share = max(ops.BALANCED_MIN_CHUNK, -(-sum(lens) // target))
    pieces = items[:used, 2] - items[:used, 1]
    assert pieces.max() <= share + 16
    assert used <= target + len(lens)
    assert (np.diff(pieces) <= 0).all()  # longest first
    assert (items[used:, 0] == -1).all()
    by_row = items[:used][np.argsort(items[:used, 3])]
    assert (by_row[:, 3] == np.arange(used)).all()  # every row written once
    for s, n in enumerate(lens):
        rows = by_row[offsets[s] : offsets[s + 1]]
        assert (rows[:, 0] == s).all()
        assert rows[0, 1] == 0 and rows[-1, 2] == n
        assert (rows[1:, 1] == rows[:-1, 2]).all()


def test_balanced_refuses_bad_plans_and_kernels() -> None:
    rng = np.random.default_rng(9)
    lens = [100, 40]
    kv = make_paged_kv(rng, "numpy", "float32", "nhd", "auto", lens, 16, 1, 64)
    query, _ = rand_array(rng, (2, 2, 64), "numpy", "float32")
    items, offsets, _ = _plan(lens, 4, None)
    kw = dict(dtype="float32", kvh=1)

    def run(it, off, **extra):
        _run(kv, query, lens, it, off, "numpy", 0.1, **kw, **extra)

    bad = items.copy()
    bad[bad[:, 3] == 0, 2] += 16  # sequence 0's first piece past its neighbour's start
    with pytest.raises(ValueError, match="row 1 must hold sequence 0's next keys"):
        run(bad, offsets)
    twice = items.copy()
    twice[1, 3] = twice[0, 3]
    with pytest.raises(ValueError, match=r"work_items\[1\] .* that no other item writes"):
        run(twice, offsets)
    short = offsets.copy()
    short[1] -= 1  # sequence 0's last piece left out
    with pytest.raises(ValueError, match="sequence 0's items end at key"):
        run(items, short)
    with pytest.raises(ValueError, match="kernel 'hopper' runs on CUDA arrays"):
        run(items, offsets, kernel="hopper")
    with pytest.raises(ValueError, match="tmp_out"):
        ops.paged_attention_balanced(
            np.zeros((2, 2, 64), np.float32),
            np.zeros((items.shape[0], 2), np.float32),
            np.zeros((items.shape[0], 2), np.float32),
            np.zeros((items.shape[0], 2, 32), np.float32),
            query,
            kv.key_cache,
            kv.value_cache,
            1,
            0.1,
            kv.block_tables,
            np.array(lens, np.int32),
            items,
            offsets,
            100,
        )
    with pytest.raises(ValueError, match="room for 1 work items but 2 sequences"):
        ops.plan_balanced_decode(
            np.array(lens, np.int32), np.zeros((1, 4), np.int32), np.zeros(3, np.int32), 4
        )


def test_forward_decode_schedules_and_reusable_plan() -> None:
    """PagedAttention.forward_decode(schedule="balanced") and a BalancedDecode refilled for two
    batches agree with the partition split and the reference; a bad schedule is refused."""
    from pagedkv import PagedAttention
    from pagedkv.balanced_decode import BalancedDecode, prefers_balanced

    rng = np.random.default_rng(11)
    kvh, group, d, bs = 2, 4, 64, 16
    lens = [900, 20, 301, 1]
    kv = make_paged_kv(rng, "torch", "float32", "nhd", "auto", lens, bs, kvh, d)
    query, q64 = rand_array(rng, (4, kvh * group, d), "torch", "float32")
    sl = torch.tensor(lens, dtype=torch.int32)
    args = (query, kv.key_cache, kv.value_cache, kv.block_tables, sl, max(lens), "auto", kvh)
    rest = (0.125, None, 1.0, 1.0)
    want = ref.decode(q64, kv.k_dense, kv.v_dense, kv.block_tables_np, np.array(lens), 0.125)
    got = {
        s: PagedAttention.forward_decode(*args, *rest, schedule=s)
        for s in ("partition", "balanced")
    }
    for s, out in got.items():
        assert ref.rel_error(to_np(out), want) < 2e-6, s
    with pytest.raises(ValueError, match="schedule must be one of"):
        PagedAttention.forward_decode(*args, *rest, schedule="fast")

    plan = BalancedDecode(
        max_seqs=6, num_heads=kvh * group, head_size=d, target_items=6, device="cpu"
    )
    for batch in ([0, 1, 2, 3], [2, 0]):
        sub = [lens[i] for i in batch]
        used = plan.fill(sub)
        assert used >= len(sub) and plan.longest_piece() < max(sub)
        out = torch.full((len(batch), kvh * group, d), float("nan"))
        plan.run(
            out,
            query[batch],
            kv.key_cache,
            kv.value_cache,
            kvh,
            0.125,
            kv.block_tables[batch],
            torch.tensor(sub, dtype=torch.int32),
            max(sub),
        )
        want_b = ref.decode(
            q64[batch], kv.k_dense, kv.v_dense, kv.block_tables_np[batch], np.array(sub), 0.125
        )
        assert ref.rel_error(to_np(out), want_b) < 2e-6, batch
    # The auto rule: a plan that halves the longest CTA wins, one that does not loses.
    items = np.array([[0, 0, 100, 0], [0, 100, 200, 1], [1, 0, 20, 2], [2, 0, 20, 3]], np.int32)
    assert prefers_balanced([200, 20, 20], 0, items, 4)
    assert not prefers_balanced([200, 20, 20], 128, items, 4)
    # ... and only for a skewed batch (the longest >= AUTO_SKEW x the mean): uniform lengths
    # keep the split, which measured faster there
    even = np.array([[0, 0, 100, 0], [0, 100, 200, 1], [1, 0, 100, 2], [1, 100, 200, 3]], np.int32)
    assert not prefers_balanced([200, 200], 0, even, 4)
