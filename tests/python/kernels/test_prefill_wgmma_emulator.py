"""CPU checks of the Hopper wgmma prefill kernel's shared-memory and fragment index math
(src/ops/cuda/prefill_wgmma_consume.cuh, prefill_wgmma_tile.cuh, wgmma.cuh) under the numpy wgmma
model (wgmma_model.py): Q, K and V tiles stored with the kernel's swizzled chunk addresses and
read back through the kernel's descriptors give S = Q K^T for each consumer warpgroup's 64 rows
and O = P V with P re-packed from the S accumulators; and at tile level, the consumer loop orders
S, softmax, rescale and P V correctly; the producer's TMA boxes and cp.async groups
(prefill_wgmma_produce.cuh) land where the descriptors read. The functions below mirror the
kernel's expressions; keep them in step."""

from __future__ import annotations

import numpy as np
import pytest
from support.wgmma_emulator import (
    acc_index,
    decode,
    desc_sw128,
    read_k_major,
    read_mn_major,
    regs_to_a,
    sw128,
    tma_store_sw128,
    wgmma,
)

BM, BN = 128, 128  # Tile<DP>::BM, BN


def store_tile(smem: np.ndarray, base: int, mat: np.ndarray) -> None:
    """load_q / load_kv: row j, 16-byte chunk c of a [rows][dp] tile to base + sw128(j, c, rows)."""
    rows, dp = mat.shape
    for j in range(rows):
        for c in range(dp // 8):
            addr = base + sw128(j, c, rows)
            smem[addr // 2 : addr // 2 + 8] = mat[j, 8 * c : 8 * c + 8]


def qk(smem: np.ndarray, q_addr: int, k_addr: int, dp: int) -> np.ndarray:
    """issue_qk(): S accumulators [128 threads, BN / 8, 4] of one warpgroup."""
    s = np.full((128, BN // 8, 4), np.nan)
    for kk in range(dp // 16):
        col = (kk % 4) * 32
        da = desc_sw128(q_addr + (kk // 4) * BM * 128 + col, 16, 1024)
        db = desc_sw128(k_addr + (kk // 4) * BN * 128 + col, 16, 1024)
        wgmma(s, read_k_major(smem, da, 64), read_k_major(smem, db, BN).T, scale_d=kk > 0)
    return s


def pv(smem: np.ndarray, o: np.ndarray, s: np.ndarray, v_addr: int, dp: int) -> None:
    """pack_p() + issue_pv(): o += P V, P packed from s per k-step of 16 keys."""
    for kk in range(BN // 16):
        regs = np.stack(
            [s[:, 2 * kk, 0:2], s[:, 2 * kk, 2:4], s[:, 2 * kk + 1, 0:2], s[:, 2 * kk + 1, 2:4]],
            axis=1,
        )
        b = read_mn_major(smem, desc_sw128(v_addr + kk * 16 * 128, BN * 128, 1024), dp)
        wgmma(o, regs_to_a(regs), b)


def gather(acc: np.ndarray) -> np.ndarray:
    """Per-thread accumulators [128, n / 8, 4] -> the 64 x n matrix."""
    m = np.full((64, acc.shape[1] * 8), np.nan)
    for tid in range(128):
        for j in range(acc.shape[1]):
            for e in range(4):
                m[acc_index(tid, j, e)] = acc[tid, j, e]
    return m


def test_descriptor_fields_round_trip():
    for addr, lbo, sbo in [(0x1C400, 16, 1024), (0x2A000, 16384, 1024), (1024, 8192, 1024)]:
        assert decode(desc_sw128(addr, lbo, sbo)) == (addr, lbo, sbo, 1)


def test_sw128_rows_of_an_atom_hit_distinct_banks():
    """8 rows written or read at the same chunk cover all 32 banks (no conflicts)."""
    for c in range(16):
        banks = {(sw128(r, c, BM) // 4 + w) % 32 for r in range(8) for w in range(4)}
        assert len(banks) == 32


@pytest.mark.parametrize("dp", [64, 128])
@pytest.mark.parametrize("wg", [0, 1])
def test_qk_and_pv_read_the_stored_tiles(dp, wg):
    rng = np.random.default_rng()
    q = rng.integers(-4, 5, (BM, dp)).astype(np.float64)  # small integers: exact products
    k = rng.integers(-4, 5, (BN, dp)).astype(np.float64)
    v = rng.integers(-4, 5, (BN, dp)).astype(np.float64)
    k_off = BM * dp * 2  # Tile::kKOff; a V stage after two K stages, like kVOff + stage 1
    v_off = k_off + 2 * BN * dp * 2 + BN * dp * 2
    smem = np.full((v_off + BN * dp * 2) // 2, np.nan)
    store_tile(smem, 0, q)
    store_tile(smem, k_off, k)
    store_tile(smem, v_off, v)

    s = qk(smem, wg * 64 * 128, k_off, dp)
    rows = slice(wg * 64, wg * 64 + 64)
    np.testing.assert_array_equal(gather(s), q[rows] @ k.T)

    p = rng.integers(-2, 3, s.shape).astype(np.float64)  # stand-in probabilities
    o = np.zeros((128, dp // 8, 4))
    pv(smem, o, p, v_off, dp)
    np.testing.assert_array_equal(gather(o), gather(p) @ v)


def _online_softmax(s: np.ndarray, m: np.ndarray, lsum: np.ndarray) -> np.ndarray:
    """prefill_softmax.cuh's update for an unmasked tile (natural-log domain here): turns s into
    P in place, updates the running max m and sum lsum, returns the rescale factor alpha."""
    mx = np.maximum(m, s.max(axis=1))
    alpha = np.exp(m - mx)
    s[:] = np.exp(s - mx[:, None])
    lsum[:] = lsum * alpha + s.sum(axis=1)
    m[:] = mx
    return alpha


def test_consumer_loop_matches_softmax_attention():
    """consume() at tile level: the order of S, softmax, rescale and P V, with dead tiles
    (skipped keys) anywhere."""
    rng = np.random.default_rng()
    n_tiles, rows, bn, dp = 6, 8, 4, 5
    q = rng.normal(size=(rows, dp))
    k = rng.normal(size=(n_tiles * bn, dp))
    v = rng.normal(size=(n_tiles * bn, dp))
    live = rng.random(n_tiles) < 0.7
    live[rng.integers(n_tiles)] = True
    o, lsum, m = np.zeros((rows, dp)), np.zeros(rows), np.full(rows, -np.inf)
    tile = lambda x, i: x[i * bn : (i + 1) * bn]  # noqa: E731
    for it in range(n_tiles):
        if live[it]:
            s = q @ tile(k, it).T
            o *= _online_softmax(s, m, lsum)[:, None]
            o += s @ tile(v, it)
    keys = np.concatenate([tile(k, i) for i in range(n_tiles) if live[i]])
    vals = np.concatenate([tile(v, i) for i in range(n_tiles) if live[i]])
    w = np.exp(q @ keys.T - (q @ keys.T).max(axis=1, keepdims=True))
    np.testing.assert_allclose(
        o / lsum[:, None], (w / w.sum(axis=1, keepdims=True)) @ vals, rtol=1e-10
    )


def _load_half(
    smem, tile, cache, new, bt, kt, ctx, k_hi, kv_end, qs, kvh, cache_tma, new_tma, tile_rows, dp
):
    """prefill_wgmma_produce.cuh load_half(): a tile entirely in the sequence's new tokens by
    whole-tile boxes (tile_rows tokens each); else each 16-key group by TMA boxes (cache: 4-D map,
    16 slots of one block; new tokens before the sequence's end kv_end: 3-D map, zeros past the
    tensor's end) or by load_group()'s cp.async (zeros from k_hi on). Returns the bytes thread 0
    expects."""
    block_size, n_tok = cache.shape[1], new.shape[0]

    def new_box(tok, rows, cols):  # 3-D map box: rows past the tensor's end read as zeros
        box = np.zeros((rows, 64))
        box[: max(0, min(rows, n_tok - tok))] = new[tok : tok + rows, kvh, cols]
        return box

    if tile_rows and kt >= ctx and kt + BN <= kv_end:
        for r in range(0, BN, tile_rows):
            for cb in range(dp // 64):
                cols = slice(cb * 64, cb * 64 + 64)
                tma_store_sw128(
                    smem,
                    tile + cb * BN * 128 + r * 128,
                    new_box(qs + kt + r - ctx, tile_rows, cols),
                )
        return BN * dp * 2
    expected = 0
    for g in range(BN // 16):
        key0 = kt + 16 * g
        tma = cache_tma if key0 + 16 <= ctx else (key0 >= ctx and key0 + 16 <= kv_end and new_tma)
        if tma:
            expected += 16 * dp * 2
            for cb in range(dp // 64):
                cols = slice(cb * 64, cb * 64 + 64)
                if key0 < ctx:
                    slot = key0 % block_size
                    assert slot % 16 == 0 and slot + 16 <= block_size  # the box stays in the block
                    box = cache[bt[key0 // block_size], slot : slot + 16, kvh, cols]
                else:
                    box = new_box(qs + key0 - ctx, 16, cols)
                tma_store_sw128(smem, tile + cb * BN * 128 + g * 16 * 128, box)
        else:
            for j in range(16):
                key = key0 + j
                row = (
                    cache[bt[key // block_size], key % block_size, kvh]
                    if key < ctx
                    else new[qs + key - ctx, kvh]
                    if key < k_hi
                    else np.zeros(dp)
                )
                for c in range(dp // 8):
                    addr = tile + sw128(16 * g + j, c, BN)
                    smem[addr // 2 : addr // 2 + 8] = row[8 * c : 8 * c + 8]
    return expected


@pytest.mark.parametrize("tile_rows", [0, 128, 32])
@pytest.mark.parametrize("dp", [64, 128])
@pytest.mark.parametrize("block_size,cache_tma", [(16, True), (32, True), (48, True), (24, False)])
def test_producer_groups_land_where_wgmma_reads(dp, block_size, cache_tma, tile_rows):
    """TMA boxes and cp.async groups of a tile (crossing the context's end at a position not a
    multiple of 16, or all new tokens) together form the K tile the QK descriptors read: cached
    keys from their blocks, new tokens after them, zeros past k_hi. The next sequence's rows
    (past kv_end) are inf: no copy may bring them in (0 * inf would be NaN in P V)."""
    rng = np.random.default_rng()
    n_blocks, heads, kvh, qs = 12, 2, 1, 5
    ctx = int(rng.integers(1, 8)) * 16 + int(rng.integers(1, 16))  # not a multiple of 16
    n_new = int(rng.integers(20, 300))
    kv_end = ctx + n_new
    kt = rng.choice(
        [
            (ctx // BN) * BN,
            max(0, ctx - 40) & ~15,
            (ctx + 15) & ~15,
            (kv_end - BN) & ~15 if kv_end - BN >= ctx else ctx & ~15,
        ]
    )
    k_hi = kv_end - int(rng.integers(0, 10))
    cache = rng.integers(-4, 5, (n_blocks, block_size, heads, dp)).astype(np.float64)
    new = rng.integers(-4, 5, (qs + n_new + 150, heads, dp)).astype(np.float64)
    new[qs + n_new :] = np.inf  # the next sequence's tokens
    bt = rng.permutation(n_blocks)
    q = rng.integers(-4, 5, (BM, dp)).astype(np.float64)
    k_off = BM * dp * 2
    smem = np.full((k_off + BN * dp * 2) // 2, np.nan)
    store_tile(smem, 0, q)
    got = _load_half(
        smem, k_off, cache, new, bt, kt, ctx, k_hi, kv_end, qs, kvh, cache_tma, True, tile_rows, dp
    )
    whole = tile_rows and kt >= ctx and kt + BN <= kv_end
    assert (
        got == BN * dp * 2
        if whole
        else got
        == sum(
            16 * dp * 2
            for g in range(BN // 16)
            if (kt + 16 * g + 16 <= ctx and cache_tma) or ctx <= kt + 16 * g <= kv_end - 16
        )
    )
    keys = np.zeros((BN, dp))
    for j in range(BN):
        key = kt + j
        if key < ctx:
            keys[j] = cache[bt[key // block_size], key % block_size, kvh]
        elif key < (kv_end if whole else k_hi):  # whole tiles read past k_hi, within the sequence
            keys[j] = new[qs + key - ctx, kvh]
    s = gather(qk(smem, 0, k_off, dp))
    live = min(BN, k_hi - kt)
    assert np.isfinite(s).all()
    np.testing.assert_array_equal(s[:, :live], q[:64] @ keys[:live].T)
