"""CPU attention ops with every logit feature at once (ALiBi + sliding window + soft-cap) and
with strided ALiBi slopes, against the float64 reference (support/reference_attention.py).

test_ops_cpu.py turns each feature on at random in 30 % of its cases, so combinations are rare:
mutation testing found that an ALiBi bias measured from the tile start instead of the first
visible key (it only differs when a sliding window starts inside a key tile) passed every test,
as did reading the slopes with stride 1 whatever their real stride.
float32 throughout, so the bound is tight (METHOD.md: float32 lands far under 1e-3).
"""

from __future__ import annotations

import numpy as np
import pytest
from pagedkv import PagedAttention
from support import reference_attention as ref
from support.deps import need
from support.paged_cases import (
    empty_like_fw,
    make_paged_kv,
    rand_array,
    run_paged_decode,
    to_fw,
    to_np,
)

torch = need("torch")

TOL = 2e-6


def _slopes(rng: np.random.Generator, h: int, strided: bool) -> tuple:
    """ALiBi slopes as float32 (numpy), contiguous or every other element of a wider array."""
    s = rng.uniform(0.05, 0.5, h).astype(np.float32)
    if not strided:
        return s, s.astype(np.float64)
    wide = np.full(2 * h, np.nan, np.float32)  # the skipped elements would poison the output
    wide[::2] = s
    view = wide[::2]
    assert not view.flags.c_contiguous
    return view, s.astype(np.float64)


@pytest.mark.parametrize("seed", range(8))
def test_prefix_prefill_alibi_window_softcap_together(seed: int) -> None:
    rng = np.random.default_rng(70_000 + seed)
    layout = ("vllm", "nhd")[seed % 2]
    d, bs, kvh, group = 64, (8, 16, 32)[seed % 3], 1 + seed % 2, (1, 4)[seed % 2]
    h = kvh * group
    ctx = [int(rng.integers(40, 200)) for _ in range(2)]
    qlen = [int(rng.integers(20, 90)) for _ in range(2)]
    kv = make_paged_kv(rng, "numpy", "float32", layout, "auto", ctx, bs, kvh, d)
    t = sum(qlen)
    query, q64 = rand_array(rng, (t, h, d), "numpy", "float32")
    key, k64 = rand_array(rng, (t, kvh, d), "numpy", "float32")
    value, v64 = rand_array(rng, (t, kvh, d), "numpy", "float32")
    qsl = np.concatenate([[0], np.cumsum(qlen)])
    seq = np.array(ctx) + np.array(qlen)
    # Windows that start mid-tile (not a multiple of the block size or of 64).
    window = int(rng.integers(20, 120)) | 1
    cap = float(rng.uniform(5, 20))
    slopes, slopes64 = _slopes(rng, h, strided=seed % 4 == 3)
    scale = 0.125
    out = PagedAttention.forward_prefix(
        query,
        key,
        value,
        "auto",
        kv.key_cache,
        kv.value_cache,
        kv.block_tables,
        qsl.astype(np.int32),
        seq.astype(np.int32),
        max(qlen),
        slopes,
        window,
        1.0,
        1.0,
        scale=scale,
        logits_soft_cap=cap,
    )
    got = to_np(out)
    assert not np.isnan(got).any()
    want = ref.prefix_prefill(
        q64,
        k64,
        v64,
        kv.k_dense,
        kv.v_dense,
        kv.block_tables_np,
        qsl,
        seq,
        scale,
        alibi_slopes=slopes64,
        soft_cap=cap,
        sliding_window=window,
    )
    # The features must matter on this data, or the comparison proves nothing.
    plain = ref.prefix_prefill(
        q64, k64, v64, kv.k_dense, kv.v_dense, kv.block_tables_np, qsl, seq, scale
    )
    assert ref.rel_error(plain, want) > 0.05
    assert ref.rel_error(got, want) < TOL, (layout, bs, kvh, group, ctx, qlen, window)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("layout", ["vllm", "nhd"])
def test_decode_alibi_window_softcap_and_strided_slopes(version: int, layout: str) -> None:
    rng = np.random.default_rng(71_000 + version * 10 + len(layout))
    d, bs, kvh, group = 128, 16, 2, 4
    h = kvh * group
    lens = [700, 65, 1]
    kv = make_paged_kv(rng, "numpy", "float32", layout, "auto", lens, bs, kvh, d)
    query, q64 = rand_array(rng, (3, h, d), "numpy", "float32")
    seq_lens = np.array(lens, np.int32)
    for strided in (False, True):
        slopes, slopes64 = _slopes(rng, h, strided)
        window, cap = 301, 12.0
        want = ref.decode(
            q64,
            kv.k_dense,
            kv.v_dense,
            kv.block_tables_np,
            np.array(lens),
            0.1,
            alibi_slopes=slopes64,
            soft_cap=cap,
            sliding_window=window,
        )
        out = empty_like_fw((3, h, d), "numpy", "float32")
        run_paged_decode(
            version,
            out,
            query,
            kv,
            kvh,
            0.1,
            seq_lens,
            bs,
            700,
            slopes,
            partition_size=256,
            logits_soft_cap=cap,
            sliding_window=window,
        )
        assert not np.isnan(out).any()
        assert ref.rel_error(out, want) < TOL, (version, layout, strided)


def test_strided_alibi_slopes_from_torch() -> None:
    """A torch view with stride 2 (e.g. a slice of a larger slopes table) reads the right
    slopes."""
    rng = np.random.default_rng(72)
    kv = make_paged_kv(rng, "torch", "float32", "nhd", "auto", [90], 16, 1, 64)
    query, q64 = rand_array(rng, (1, 4, 64), "torch", "float32")
    wide = torch.full((8,), float("nan"))
    wide[::2] = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    out = PagedAttention.forward_decode(
        query,
        kv.key_cache,
        kv.value_cache,
        kv.block_tables,
        to_fw(np.array([90]), "torch", "int32"),
        90,
        "auto",
        1,
        0.1,
        wide[::2],
        1.0,
        1.0,
    )
    want = ref.decode(
        q64,
        kv.k_dense,
        kv.v_dense,
        kv.block_tables_np,
        np.array([90]),
        0.1,
        alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625]),
    )
    assert ref.rel_error(to_np(out), want) < TOL
