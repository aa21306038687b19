"""The lane-level model of the Hopper decode's arithmetic (decode_bulk_model.py) against a direct
softmax(q k^T) v: the fragment index expressions of decode_bulk.cuh, for 16-bit and fp8 caches,
one or two 8-head column tiles, all head sizes the kernel takes, swizzled tensor-copy tiles and
padded row tiles, masked edge keys. No GPU."""

from __future__ import annotations

import numpy as np
import pytest
from support.decode_bulk_emulator import (
    KEYS,
    at,
    ld_at,
    ld_lane_k,
    ld_lane_v,
    out_dim,
    tile_form,
    warp_attention,
)


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("head_tiles", [1, 2])
@pytest.mark.parametrize("D", [32, 64, 80, 96, 128, 256])
def test_warp_attention_matches_softmax(D, head_tiles, fp8, tma):
    if fp8 and D % 32:
        pytest.skip("fp8 caches need head sizes that are multiples of 32 (decode_bulk.cu)")
    if tma and D * (1 if fp8 else 2) % 128:
        pytest.skip("tensor copies need rows of a multiple of 128 bytes (decode_bulk.cu)")
    rng = np.random.default_rng(D * 10 + head_tiles + 100 * fp8)
    heads, chunks = 8 * head_tiles, 3
    q = rng.standard_normal((heads, D))
    ks = [rng.standard_normal((KEYS, D)) for _ in range(chunks)]
    vs = [rng.standard_normal((KEYS, D)) for _ in range(chunks)]
    valid = [[True] * KEYS for _ in range(chunks)]
    valid[0][:5] = [False] * 5  # a window's first chunk and the sequence's last
    valid[-1][11:] = [False] * 5
    for v, ok in zip(vs, valid):
        v[~np.array(ok)] = 0.0  # as the kernel zeroes uncopied V rows
    c_out = 0.3
    out, m, lsum = warp_attention(q, ks, vs, valid, fp8, c_out, tma)

    kk = np.concatenate(ks)[np.concatenate(valid)]
    vv = np.concatenate(vs)[np.concatenate(valid)]
    x = q @ kk.T * c_out
    assert np.allclose(m, x.max(1))
    p = np.exp2(x - x.max(1, keepdims=True))
    assert np.allclose(lsum, p.sum(1))
    assert np.allclose(out / lsum[:, None], p @ vv / p.sum(1, keepdims=True))


@pytest.mark.parametrize("fp8", [False, True])
def test_out_dim_is_a_permutation_of_each_tile(fp8):
    dims = sorted(out_dim(fp8, mt, rr) for mt in range(8) for rr in range(16))
    assert dims == list(range(128))
    assert all(out_dim(fp8, mt, rr) // 16 == mt for mt in range(8) for rr in range(16))


@pytest.mark.parametrize("row_bytes,tma", [(64, False), (256, False), (128, True), (512, True)])
def test_ld_at_is_at_of_the_lanes_row(row_bytes, tma):
    """The kernel's hoisted ldmatrix addresses (ld_at, per-lane base and xor) equal `at` of the
    row and unit each lane supplies, for every even unit of the row."""
    form = tile_form(row_bytes, tma)
    for lane in range(32):
        for u in range(0, row_bytes // 16, 2):
            assert ld_at(form, ld_lane_k(form, lane), u) == at(
                form, (lane & 7) + (lane & 8), u + (lane >> 4)
            )
            assert ld_at(form, ld_lane_v(form, lane), u) == at(
                form, (lane & 7) + (lane >> 4) * 8, u + ((lane >> 3) & 1)
            )
