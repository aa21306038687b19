"""A lane-level Python model of the tensor-core decode kernel (src/ops/cuda/decode_mma.cuh), for
checking its index arithmetic without a GPU: the 16-byte copies of each lane (run mapping,
block-table shuffles, zero-fill, [d][slot] value runs), the fp8 dequantisation pass, the
sanitising of straddling runs, the per-warp stage ring and the cross-warp merge. The tensor-core
steps are modelled as float matrix products on the shared-memory tiles (their fragment layouts
are those of the tested prefill kernel). Mirrors the kernel line by line; keep them in step."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from support.ptx_fragments import ldmatrix_x4, mma_16816

KEYS, WARPS, L2E = 16, 4, 1.4426950408889634


@dataclass
class Layout:  # cache_layout.cuh's CacheLayout, element strides
    s_block: int
    s_head: int
    s_slot: int
    s_chunk: int
    x: int


def layout_of(shape: tuple, strides: tuple, vllm: bool, is_value: bool) -> Layout:
    if not vllm:
        return Layout(strides[0], strides[2], strides[1], 0, shape[3])
    if not is_value:
        return Layout(strides[0], strides[1], strides[3], strides[2], shape[4])
    return Layout(strides[0], strides[1], strides[3], strides[2], 1)


def plan(D: int, esz: int, kl: Layout, vl: Layout, block_size: int, budget: int = 72 * 1024):
    """decode_mma.cu's plan(): None when not covered."""
    epr = 16 // esz
    if kl.s_chunk == 0 and kl.x >= D:
        k_run = epr
    elif kl.x == epr:
        k_run = kl.s_chunk
    else:
        return None
    if vl.s_chunk == 0 and vl.x >= D:
        v_trans, v_run = 0, epr
    elif vl.x == 1 and vl.s_slot == 1 and block_size % epr == 0:
        v_trans, v_run = 1, 0
    else:
        return None
    k_span = 16 * kl.s_slot + (D // epr) * k_run
    v_span = 0 if v_trans else 16 * vl.s_slot + (D // epr) * v_run
    one_block = int(
        block_size % 16 == 0 and max(k_span, v_span) < 2**31 and kl.s_slot >= 0 and vl.s_slot >= 0
    )
    k_pitch = D + 8
    v_pitch = 24 if v_trans else D + 8
    kt = 16 * k_pitch * 2
    vt = (D if v_trans else 16) * v_pitch * 2
    fp8 = esz == 1
    stage = 32 * D if fp8 else kt + vt
    tile = kt + vt if fp8 else 0
    q_bytes = kt
    per_warp = (budget - q_bytes) // WARPS - tile
    stages = min(max(per_warp // stage, 2), 8)
    warp_bytes = max(stages * stage + tile, 16 * D * 4)
    return dict(
        k_run=k_run,
        v_run=v_run,
        v_trans=v_trans,
        one_block=one_block,
        k_pitch=k_pitch,
        v_pitch=v_pitch,
        stage_bytes=stage,
        tile_bytes=tile,
        q_bytes=q_bytes,
        stages=stages,
        warp_bytes=warp_bytes,
        kt_bytes=kt,
    )


class Smem:
    """Shared memory as element values at byte addresses (size checked against the plan)."""

    def __init__(self, size: int):
        self.size, self.v = size, {}

    def put(self, addr: int, vals, esz: int):
        for i, x in enumerate(vals):
            a = addr + i * esz
            assert 0 <= a < self.size, ("shared memory out of bounds", a, self.size)
            self.v[a] = x

    def get(self, addr: int) -> float:
        assert 0 <= addr < self.size, ("shared memory out of bounds", addr, self.size)
        return self.v.get(addr, float("nan"))  # never written: NaN


def run_cta(
    q: np.ndarray,
    kc: np.ndarray,
    vc: np.ndarray,
    kl: Layout,
    vl: Layout,
    esz: int,
    bt: np.ndarray,
    num_blocks: int,
    block_size: int,
    seq_len: int,
    kvh: int,
    g0: int,
    group: int,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    softcap: float = 0.0,
    alibi: Optional[np.ndarray] = None,
    window: int = 0,
    partition: int = 0,
    part: int = 0,
):
    """One CTA: returns (out [ng, D], M, L) like the kernel's merge, or None if it returns early.
    q: [num_heads, D]; kc / vc: flat caches (elements); bt: this sequence's block table."""
    D = q.shape[1]
    mp = plan(D, esz, kl, vl, block_size)
    assert mp is not None
    epr = 16 // esz
    fp8 = esz == 1
    ng = min(16, group - g0)
    q_pos = seq_len - 1
    k_lo, k_hi = 0, seq_len
    if window > 0:
        k_lo = max(k_lo, q_pos - window + 1)
    if partition > 0:
        if part * partition >= k_hi:
            return None
        k_lo, k_hi = max(k_lo, part * partition), min(k_hi, (part + 1) * partition)
    smem = Smem(mp["q_bytes"] + WARPS * mp["warp_bytes"])
    kp, vp, ktb = mp["k_pitch"], mp["v_pitch"], mp["kt_bytes"]
    qs = np.zeros((16, D))
    qs[:ng] = q[kvh * group + g0 : kvh * group + g0 + ng]
    R = D // epr
    rinv = (65536 + R - 1) // R
    kd_max = 4 if D <= 64 else 8 if D <= 128 else 16
    nik = (KEYS * (kd_max * 16 // epr) + 31) // 32
    niv = (kd_max * 16 * (KEYS // epr) + 31) // 32
    kbase, vbase = kvh * kl.s_head, kvh * vl.s_head
    bs_pow2 = block_size & (block_size - 1) == 0
    max_blocks = len(bt)
    one_block = kd_max <= 8 and mp["one_block"]

    def slot_of(tok):
        return tok & (block_size - 1) if bs_pow2 else tok % block_size

    def valid(tok):
        return k_lo <= tok < k_hi

    def lookup(c):
        nb = []
        for lane in range(32):
            tok = c * KEYS + (0 if one_block else lane & 15)
            b = 0
            if (tok < k_hi and tok + KEYS > k_lo) if one_block else valid(tok):
                b = int(bt[min(tok // block_size, max_blocks - 1)])
                b = b if 0 <= b < num_blocks else 0
            nb.append(b)
        return nb

    def krow_dst(st, is_v, j, r):
        if fp8:
            return st + (16 * D if is_v else 0) + j * D + r * 16
        return st + (ktb if is_v else 0) + (j * (vp if is_v else kp) + r * epr) * 2

    def vt_dst(st, d, h):
        if fp8:
            return st + 16 * D + d * 16
        return st + ktb + (d * vp + h * 8) * 2

    def copy(dst, src_arr, src, ok):
        vals = src_arr[src : src + epr] if ok else np.zeros(epr)
        assert len(vals) == epr
        smem.put(dst, vals, esz)

    def issue_one_block(key0, st, nblk):
        slot0 = slot_of(key0)
        for i in range(nik):
            for lane in range(32):
                blk = nblk[lane]
                assert blk == nblk[0], "one_block: the chunk's block is lane-uniform"
                kb = kbase + blk * kl.s_block + slot0 * kl.s_slot
                vb = vbase + blk * vl.s_block + slot0 * vl.s_slot
                idx = i * 32 + lane
                j = min((idx * rinv) >> 16, KEYS - 1)
                r = idx - j * R
                if idx < KEYS * R:
                    ok = valid(key0 + j)
                    copy(krow_dst(st, False, j, r), kc, kb + j * kl.s_slot + r * mp["k_run"], ok)
                    if not mp["v_trans"]:
                        copy(krow_dst(st, True, j, r), vc, vb + j * vl.s_slot + r * mp["v_run"], ok)

    def issue(c, st, nblk):
        key0 = c * KEYS
        if one_block:
            issue_one_block(key0, st, nblk)
        for i in range(0 if one_block else nik):
            for lane in range(32):
                idx = i * 32 + lane
                j = min((idx * rinv) >> 16, KEYS - 1)
                r = idx - j * R
                blk = nblk[j]
                if idx < KEYS * R:
                    assert j == idx // R and r == idx % R
                    tok = key0 + j
                    ok = valid(tok)
                    slot = slot_of(tok)
                    copy(
                        krow_dst(st, False, j, r),
                        kc,
                        kbase + blk * kl.s_block + slot * kl.s_slot + r * mp["k_run"],
                        ok,
                    )
                    if not mp["v_trans"]:
                        copy(
                            krow_dst(st, True, j, r),
                            vc,
                            vbase + blk * vl.s_block + slot * vl.s_slot + r * mp["v_run"],
                            ok,
                        )
        if mp["v_trans"]:
            for i in range(niv):
                for lane in range(32):
                    idx = i * 32 + lane
                    d, h = (idx >> 1, idx & 1) if epr == 8 else (idx, 0)
                    t0 = key0 + h * epr
                    ok = t0 + epr > k_lo and t0 < k_hi
                    tk = min(max(t0, k_lo), k_hi - 1)
                    blk = nblk[(tk - key0) & (KEYS - 1)]
                    if d < D:
                        copy(
                            vt_dst(st, d, h),
                            vc,
                            vbase + blk * vl.s_block + d * vl.s_chunk + slot_of(t0),
                            ok,
                        )

    def dequant(st, tile):
        if not fp8:
            return
        for i in range(nik):
            for lane in range(32):
                idx = i * 32 + lane
                j = min((idx * rinv) >> 16, KEYS - 1)
                r = idx - j * R
                if idx < KEYS * R:
                    raw = [smem.get(st + j * D + r * 16 + e) for e in range(16)]
                    smem.put(tile + (j * kp + r * 16) * 2, raw, 2)
                    if not mp["v_trans"]:
                        raw = [smem.get(st + 16 * D + j * D + r * 16 + e) for e in range(16)]
                        smem.put(tile + ktb + (j * vp + r * 16) * 2, raw, 2)
        if mp["v_trans"]:
            for i in range(niv):
                for lane in range(32):
                    d = i * 32 + lane
                    if d < D:
                        raw = [smem.get(st + 16 * D + d * 16 + e) for e in range(16)]
                        smem.put(tile + ktb + d * vp * 2, raw, 2)

    slope = np.zeros(16)
    if alibi is not None:
        slope[:ng] = alibi[kvh * group + g0 : kvh * group + g0 + ng] * L2E
    kmul = scale * k_scale
    cl, ch = k_lo // KEYS, (k_hi + KEYS - 1) // KEYS
    states = []
    for warp in range(WARPS):
        wbase = mp["q_bytes"] + warp * mp["warp_bytes"]
        tile = wbase + mp["stages"] * mp["stage_bytes"]
        n = (ch - cl - warp + WARPS - 1) // WARPS if (k_lo < k_hi and cl + warp < ch) else 0
        m, lsum, o = np.full(16, -np.inf), np.zeros(16), np.zeros((16, D))
        S = mp["stages"]
        pending = []  # committed groups: (stage, chunk)

        def chunk(j, warp=warp):
            return cl + warp + WARPS * j

        if n > 0:
            nblk = lookup(chunk(0))
            for j in range(S - 1):
                if j < n:
                    issue(chunk(j), wbase + j * mp["stage_bytes"], nblk)
                    pending.append((j, chunk(j)))
                    nblk = lookup(chunk(j + 1))
            cur = 0
            for j in range(n):
                ahead = j + S - 1
                if ahead < n:
                    st = S - 1 if cur == 0 else cur - 1
                    issue(chunk(ahead), wbase + st * mp["stage_bytes"], nblk)
                    pending.append((st, chunk(ahead)))
                    nblk = lookup(chunk(ahead + 1))
                stage_j, chunk_j = pending.pop(0)
                assert stage_j == cur and chunk_j == chunk(j), "ring out of step"
                assert all(s != cur for s, _ in pending), "a stage in use was overwritten"
                st = wbase + cur * mp["stage_bytes"]
                key0 = chunk(j) * KEYS
                if fp8:
                    dequant(st, tile)
                    st = tile
                if mp["v_trans"] and (key0 < k_lo or key0 + KEYS > k_hi):
                    for idx in range(D * KEYS):
                        d, jj = idx // KEYS, idx % KEYS
                        if not valid(key0 + jj):
                            smem.put(st + ktb + (d * vp + jj) * 2, [0.0], 2)
                kt = np.array(
                    [[smem.get(st + (jj * kp + d) * 2) for d in range(D)] for jj in range(KEYS)]
                )
                if mp["v_trans"]:
                    vt = np.array(
                        [
                            [smem.get(st + ktb + (d * vp + jj) * 2) for d in range(D)]
                            for jj in range(KEYS)
                        ]
                    )
                else:
                    vt = np.array(
                        [
                            [smem.get(st + ktb + (jj * vp + d) * 2) for d in range(D)]
                            for jj in range(KEYS)
                        ]
                    )
                with np.errstate(invalid="ignore"):
                    s = qs @ kt.T  # [16 rows, 16 keys]
                toks = key0 + np.arange(KEYS)
                x = softcap * L2E * np.tanh(s * kmul / softcap) if softcap > 0 else s * kmul * L2E
                if alibi is not None:
                    x = x + slope[:, None] * (toks - q_pos)[None, :]
                if key0 < k_lo or key0 + KEYS > k_hi:  # edge chunk: the range mask
                    ok = (toks >= k_lo) & (toks < k_hi)
                    x = np.where(ok[None, :], x, -np.inf)
                mn = np.maximum(m, x.max(1))
                ms = np.where(mn == -np.inf, 0.0, mn)
                alpha = np.exp2(m - ms)
                p = np.exp2(x - ms[:, None])
                lsum = lsum * alpha + p.sum(1)
                m = mn
                if (alpha != 1.0).any():  # rescale only when a row's maximum grew
                    o = o * alpha[:, None]
                o = o + p @ vt
                cur = 0 if cur + 1 == S else cur + 1
        states.append((m, lsum, o))
    big_m = np.max([s[0] for s in states], axis=0)
    safe_m = np.where(np.isneginf(big_m), 0.0, big_m)
    big_l, acc = np.zeros(16), np.zeros((16, D))
    for m, lsum, o in states:
        a = np.where(np.isneginf(big_m), 0.0, np.exp2(m - safe_m))
        big_l += lsum * a
        acc += o * a[:, None]
    out = np.where(big_l[:, None] > 0, acc / np.where(big_l > 0, big_l, 1)[:, None] * v_scale, 0)
    return out[:ng], big_m[:ng], big_l[:ng]


# ---- lane level: the kernel's fragment expressions under PTX's ldmatrix / mma semantics ----


def chunk_fragments(
    qs: np.ndarray,
    kt: np.ndarray,
    vt: np.ndarray,
    D: int,
    k_pitch: int,
    v_pitch: int,
    v_trans: bool,
):
    """One warp's chunk through decode_mma.cuh's compute(): ldmatrix addresses of the query (A),
    key (B) and value (B, .trans for [key][d], plain for [d][key]) tiles, mma operand order, the
    (row, key) of each S element, P re-packing and the [16][D] output staging. qs [16][k_pitch],
    kt [16][k_pitch], vt [16][v_pitch] or [D][v_pitch]. Returns (S [16, 16], staged O [16, D])
    with P = S (unnormalised) so that O = S V."""
    fq, fk, fv = qs.reshape(-1), kt.reshape(-1), vt.reshape(-1)
    s = np.zeros((2, 32, 4))
    for ks in range(D // 16):
        a = ldmatrix_x4(fq, lambda ln, ks=ks: (ln & 15) * k_pitch + ks * 16 + (ln >> 4) * 8)
        b = ldmatrix_x4(
            fk,
            lambda ln, ks=ks: ((ln & 7) + (ln >> 4) * 8) * k_pitch + ks * 16 + ((ln >> 3) & 1) * 8,
        )
        mma_16816(s[0], a, b[:, 0], b[:, 1])
        mma_16816(s[1], a, b[:, 2], b[:, 3])
    s_mat = np.full((16, 16), np.nan)
    for lane in range(32):
        for nt in range(2):
            for e in range(4):
                row, key = (lane >> 2) + 8 * (e >> 1), nt * 8 + 2 * (lane & 3) + (e & 1)
                s_mat[row, key] = s[nt, lane, e]
    pa = np.stack([s[0, :, 0:2], s[0, :, 2:4], s[1, :, 0:2], s[1, :, 2:4]], axis=1)
    o = np.zeros((2 * (D // 16), 32, 4))
    for np_ in range(D // 16):
        if v_trans:
            b = ldmatrix_x4(
                fv,
                lambda ln, n=np_: (
                    (n * 16 + (ln & 7) + (ln >> 4) * 8) * v_pitch + ((ln >> 3) & 1) * 8
                ),
            )
        else:
            b = ldmatrix_x4(
                fv,
                lambda ln, n=np_: (
                    ((ln & 7) + ((ln >> 3) & 1) * 8) * v_pitch + n * 16 + (ln >> 4) * 8
                ),
                trans=True,
            )
        mma_16816(o[2 * np_], pa, b[:, 0], b[:, 1])
        mma_16816(o[2 * np_ + 1], pa, b[:, 2], b[:, 3])
    ow = np.full(16 * D, np.nan)
    for lane in range(32):
        r0 = lane >> 2
        for nt in range(D // 8):
            col = nt * 8 + 2 * (lane & 3)
            ow[r0 * D + col : r0 * D + col + 2] = o[nt, lane, 0:2]
            ow[(r0 + 8) * D + col : (r0 + 8) * D + col + 2] = o[nt, lane, 2:4]
    return s_mat, ow.reshape(16, D)


def reference(q, keys, vals, seq_len, scale, softcap=0.0, alibi=None, window=0, lo=0, hi=None):
    """float64 attention of q [H, D] (one KV head's group) to keys/vals [n, D] over [lo, hi)."""
    hi = seq_len if hi is None else hi
    q_pos = seq_len - 1
    start = max(lo, q_pos - window + 1) if window > 0 else lo
    idx = np.arange(start, hi)
    if len(idx) == 0:
        return np.zeros((q.shape[0], q.shape[1]))
    logits = q @ keys[idx].T * scale
    if softcap > 0:
        logits = softcap * np.tanh(logits / softcap)
    if alibi is not None:
        logits = logits + alibi[:, None] * (idx - q_pos)[None, :]
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return p @ vals[idx]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = ["Layout", "layout_of", "plan", "run_cta", "reference", "ceil_div", "math"]
