"""A lane-level Python model of the Hopper decode kernel's arithmetic on one warp's chunks
(src/ops/cuda/decode_bulk.cuh, `compute` and the output store), for checking its fragment index
expressions without a GPU: S^T = K Q^T with keys as rows, the per-head online softmax on the
accumulator fragments, the movmatrix transposes of P^T, O^T += V^T P^T, the fp8 path's permuted
head dimension (32-bit reads of fp8 rows, byte regrouping) and out_dim. Mirrors the kernel line
by line; keep them in step. fp8 values are modelled as the numbers they convert to (the
conversion is exact)."""

from __future__ import annotations

import numpy as np
from ptx_fragments import byte_perm, ldmatrix_x4, mma_16816, movmatrix_trans

KEYS, L2E = 16, 1.4426950408889634


def out_dim(fp8: bool, mt: int, rr: int) -> int:
    if fp8:
        return 32 * (mt >> 1) + 4 * (rr & 7) + 2 * (mt & 1) + (rr >> 3)
    return 16 * mt + rr


def _k_fragment(kt: np.ndarray, ks: int, fp8: bool) -> np.ndarray:
    """A fragment [lane, 4, 2] of K rows (keys) x the k step's 16 dims."""
    if not fp8:
        pitch = kt.shape[1] + 8
        flat = np.zeros(16 * pitch)
        for j in range(16):
            flat[j * pitch:j * pitch + kt.shape[1]] = kt[j]
        return ldmatrix_x4(flat, lambda lane: ((lane & 7) + (lane & 8)) * pitch + ks * 16
                           + (lane >> 4) * 8)
    a = np.zeros((32, 4, 2))
    for lane in range(32):
        r, q = lane >> 2, lane & 3
        w0 = kt[r, ks * 16 + 4 * q:ks * 16 + 4 * q + 4]
        w1 = kt[r + 8, ks * 16 + 4 * q:ks * 16 + 4 * q + 4]
        a[lane] = [w0[0:2], w1[0:2], w0[2:4], w1[2:4]]
    return a


def _q_fragment(qt: np.ndarray, ks: int, nh: int, fp8: bool) -> tuple:
    b0, b1 = np.zeros((32, 2)), np.zeros((32, 2))
    for lane in range(32):
        r, q = lane >> 2, lane & 3
        row = qt[nh * 8 + r, ks * 16:]
        o0, o1 = (4 * q, 4 * q + 2) if fp8 else (2 * q, 2 * q + 8)
        b0[lane], b1[lane] = row[o0:o0 + 2], row[o1:o1 + 2]
    return b0, b1


def _v_fragments(vt: np.ndarray, fp8: bool) -> list:
    """A fragments [lane, 4, 2] of V^T (dims x keys), one per 16-dim tile (logical rows)."""
    D = vt.shape[1]
    if not fp8:
        pitch = D + 8
        flat = np.zeros(16 * pitch)
        for j in range(16):
            flat[j * pitch:j * pitch + D] = vt[j]
        return [ldmatrix_x4(flat, lambda lane, mt=mt: ((lane & 7) + (lane >> 4) * 8) * pitch
                            + mt * 16 + (lane & 8), trans=True) for mt in range(D // 16)]
    frags = [np.zeros((32, 4, 2)) for _ in range(D // 16)]
    for m2 in range(D // 32):
        for lane in range(32):
            r, q = lane >> 2, lane & 3
            w = [list(vt[k, m2 * 32 + 4 * r:m2 * 32 + 4 * r + 4])
                 for k in (2 * q, 2 * q + 1, 2 * q + 8, 2 * q + 9)]
            t0, t1 = byte_perm(w[0], w[1], 0x5140), byte_perm(w[0], w[1], 0x7362)
            t2, t3 = byte_perm(w[2], w[3], 0x5140), byte_perm(w[2], w[3], 0x7362)
            frags[2 * m2][lane] = [t0[0:2], t0[2:4], t2[0:2], t2[2:4]]
            frags[2 * m2 + 1][lane] = [t1[0:2], t1[2:4], t3[0:2], t3[2:4]]
    return frags


def warp_attention(q: np.ndarray, ks: list, vs: list, valid: list, fp8: bool,
                   c_out: float) -> tuple:
    """One warp over its chunks: q [8 NH, D] (the staged query tile), ks / vs [16, D] per chunk,
    valid[c][j] whether key j of chunk c is in range (invalid V rows must be zeros, as the kernel
    writes them). Returns the warp's (O [heads, D] unnormalised, m [heads], l [heads]) as the
    merge reads them from shared memory."""
    heads, D = q.shape
    NH = heads // 8
    m = np.full((32, NH, 2), -np.inf)
    lsum = np.zeros((32, NH, 2))
    o = np.zeros((D // 16, NH, 32, 4))
    for kt, vt, ok in zip(ks, vs, valid):
        s = np.zeros((NH, 32, 4))
        for k in range(D // 16):
            a = _k_fragment(kt, k, fp8)
            for nh in range(NH):
                mma_16816(s[nh], a, *_q_fragment(q, k, nh, fp8))
        x = s * c_out
        for lane in range(32):
            for e in range(4):
                if not ok[(lane >> 2) + 8 * (e >> 1)]:
                    x[:, lane, e] = -np.inf
        mx = np.stack([np.maximum(x[:, :, 0], x[:, :, 2]), np.maximum(x[:, :, 1], x[:, :, 3])], -1)
        for lane in range(32):  # __shfl_xor over lane bits 2, 3, 4: the lanes of one q
            mx[:, lane] = mx[:, [(lane & 3) + 4 * i for i in range(8)]].max(1)
        mx = mx.transpose(1, 0, 2)  # [lane, nh, i]
        mn = np.maximum(m, mx)
        ms = np.where(mn == -np.inf, 0.0, mn)
        alpha = np.where(mn == m, 1.0, np.exp2(np.where(m == -np.inf, -np.inf, m) - ms))
        m = mn
        p = np.exp2(x - ms.transpose(1, 0, 2)[:, :, [0, 1, 0, 1]])  # [nh, lane, e]
        lsum = lsum * alpha + (p[:, :, 0:2] + p[:, :, 2:4]).transpose(1, 0, 2)
        o *= alpha.transpose(1, 0, 2)[None][:, :, :, [0, 1, 0, 1]]
        for mt, a in enumerate(_v_fragments(vt, fp8)):
            for nh in range(NH):
                mma_16816(o[mt, nh], a, movmatrix_trans(p[nh][:, 0:2]),
                          movmatrix_trans(p[nh][:, 2:4]))
    out = np.zeros((heads, D))
    for mt in range(D // 16):
        for nh in range(NH):
            for lane in range(32):
                r, q = lane >> 2, lane & 3
                for e in range(4):
                    out[nh * 8 + 2 * q + (e & 1), out_dim(fp8, mt, r + 8 * (e >> 1))] = \
                        o[mt, nh, lane, e]
    for i in range(3):  # the lane-partial sums, reduced over the lanes of one q
        lsum = lsum + lsum[[lane ^ (4 << i) for lane in range(32)]]
    mh = np.array([m[lane, nh, i] for nh in range(NH) for lane in range(4) for i in range(2)])
    lh = np.array([lsum[lane, nh, i] for nh in range(NH) for lane in range(4) for i in range(2)])
    return out, mh, lh
