"""Cascade decode on the CPU against float64: merge_attn_states (vLLM's semantics, empty sides
included), the balanced decode's log-sum-exp output, and pagedkv.cascade.cascade_decode (a shared
prefix attended once for all sequences, merged with each sequence's own keys)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pagedkv import ops
from support import reference_attention as ref
from support.deps import need
from support.paged_cases import make_paged_kv, rand_array, to_np

torch = need("torch")


def _merge_ref(po, pl, so, sl):
    pl = np.where(np.isinf(pl), -np.inf, pl)
    sl = np.where(np.isinf(sl), -np.inf, sl)
    m = np.maximum(pl, sl)
    safe = np.where(np.isfinite(m), m, 0.0)
    wp = np.where(np.isfinite(pl), np.exp(pl - safe), 0.0)
    ws = np.where(np.isfinite(sl), np.exp(sl - safe), 0.0)
    tot = wp + ws
    out = (wp.T[:, :, None] * po + ws.T[:, :, None] * so) / np.where(tot > 0, tot, 1.0).T[
        :, :, None
    ]
    lse = np.where(tot > 0, safe + np.log(np.where(tot > 0, tot, 1.0)), -np.inf)
    return np.where((tot > 0).T[:, :, None], out, 0.0), lse


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_merge_attn_states_matches_reference(dtype: str) -> None:
    rng = np.random.default_rng(1)
    t, h, d = 6, 4, 64
    po, po64 = rand_array(rng, (t, h, d), "torch", dtype)
    so, so64 = rand_array(rng, (t, h, d), "torch", dtype)
    pl = rng.normal(0, 3, (h, t)).astype(np.float32)
    sl = rng.normal(0, 3, (h, t)).astype(np.float32)
    pl[0, 0], sl[1, 1] = -np.inf, np.inf  # one side without keys (+inf reads as -inf)
    pl[2, 2] = sl[2, 2] = -np.inf  # neither side: zeros, -inf
    out = torch.full((t, h, d), float("nan"), dtype=getattr(torch, dtype))
    lse = torch.full((h, t), float("nan"))
    ops.merge_attn_states(out, po, torch.from_numpy(pl), so, torch.from_numpy(sl), lse)
    want, want_lse = _merge_ref(po64, pl.astype(np.float64), so64, sl.astype(np.float64))
    assert ref.rel_error(to_np(out), want) < (2e-6 if dtype == "float32" else 1e-2)
    assert np.allclose(lse.numpy(), want_lse, rtol=1e-5, atol=1e-5)
    assert (to_np(out)[2, 2] == 0).all() and lse[2, 2] == -np.inf
    pl[3, 3] = np.nan
    ops.merge_attn_states(out, po, torch.from_numpy(pl), so, torch.from_numpy(sl), lse)
    assert torch.isnan(out[3, 3]).all() and torch.isnan(lse[3, 3])
    with pytest.raises(ValueError, match="prefix_lse"):
        ops.merge_attn_states(out, po, torch.zeros(t, h), so, torch.from_numpy(sl))


def _full_tables(kv, prefix_blocks: int, lens: list[int], bs: int) -> np.ndarray:
    """Each sequence's whole context: the shared blocks, then its own."""
    own = kv.block_tables_np
    shared = own[0, :prefix_blocks]
    width = prefix_blocks + own.shape[1]
    full = np.zeros((len(lens), width), np.int32)
    for i in range(len(lens)):
        full[i, :prefix_blocks] = shared
        full[i, prefix_blocks:] = own[i + 1]
    return full


@pytest.mark.parametrize("group, cap", [(1, 0.0), (4, 15.0)])
def test_cascade_decode_matches_reference(group: int, cap: float) -> None:
    """Sequence 0 of the cache holds the shared prefix (whole blocks); sequences 1.. hold each
    decoding sequence's own keys (one of them none)."""
    from pagedkv.cascade import cascade_decode

    rng = np.random.default_rng(4 + group)
    kvh, d, bs, prefix = 2, 64, 16, 96
    own = [40, 0, 17, 1, 33]
    kv = make_paged_kv(rng, "torch", "float32", "nhd", "auto", [prefix] + own, bs, kvh, d)
    s = len(own)
    query, q64 = rand_array(rng, (s, kvh * group, d), "torch", "float32")
    pblocks = prefix // bs
    prefix_table = kv.block_tables[:1, :pblocks].contiguous()
    suffix_tables = kv.block_tables[1:].contiguous()
    out = cascade_decode(
        query,
        kv.key_cache,
        kv.value_cache,
        kvh,
        1 / math.sqrt(d),
        prefix_table,
        prefix,
        suffix_tables,
        torch.tensor(own, dtype=torch.int32),
        logits_soft_cap=cap,
    )
    full = _full_tables(kv, pblocks, own, bs)
    want = ref.decode(
        q64, kv.k_dense, kv.v_dense, full, np.array(own) + prefix, 1 / math.sqrt(d), soft_cap=cap
    )
    assert ref.rel_error(to_np(out), want) < 2e-6


def test_cascade_refuses_a_prefix_inside_a_block() -> None:
    from pagedkv.cascade import CascadeDecode

    rng = np.random.default_rng(2)
    kv = make_paged_kv(rng, "torch", "float32", "nhd", "auto", [40, 5], 16, 1, 64)
    query, _ = rand_array(rng, (1, 2, 64), "torch", "float32")
    c = CascadeDecode(query, kv.key_cache, kv.value_cache, 1)
    with pytest.raises(ValueError, match="whole blocks of 16"):
        c.plan(40, [5])
