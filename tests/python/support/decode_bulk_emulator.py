"""A lane-level Python model of the Hopper decode kernel's arithmetic on one warp's chunks
(src/ops/cuda/decode_bulk*.cuh: `compute_chunk`'s scores, softmax state and PV, and the epilogue's
output store), for checking its fragment index
expressions without a GPU: S^T = K Q^T with keys as rows, the per-head online softmax on the
accumulator fragments, the movmatrix transposes of P^T, O^T += V^T P^T, the fp8 path's permuted
head dimension (ldmatrix of fp8 byte pairs, byte regrouping), out_dim, the per-lane ldmatrix
addresses (`ld_at`) and both staged-tile forms (`at`: 128-byte-swizzled tensor-copy boxes, padded
rows). Mirrors the kernel line by line; keep
them in step. fp8 values are modelled as the numbers they convert to (the
conversion is exact)."""

from __future__ import annotations

import numpy as np

from support.ptx_fragments import byte_perm, ldmatrix_x4, ldmatrix_x4_b8, mma_16816, movmatrix_trans

KEYS, L2E = 16, 1.4426950408889634


def out_dim(fp8: bool, mt: int, rr: int) -> int:
    if fp8:
        return 16 * mt + 2 * (rr & 7) + (rr >> 3)
    return 16 * mt + rr


def tile_form(row_bytes: int, tma: bool) -> dict:
    """decode_bulk.cu's staged-tile geometry: tensor copies (128-byte swizzle) or row copies."""
    if tma:
        return {"row_stride": 128, "box": 2048, "swz": 7}
    return {"row_stride": row_bytes + 16, "box": 128, "swz": 0}


def at(form: dict, j: int, u: int) -> int:
    """The kernel's `at`: byte offset of (row j, 16-byte unit u) of a staged tile."""
    return (u >> 3) * form["box"] + j * form["row_stride"] + (((u & 7) ^ (j & form["swz"])) << 4)


def ld_lane(form: dict, row: int, hi: int) -> tuple:
    """The kernel's LdLane: (base, x) of the row a lane supplies to an ldmatrix."""
    return row * form["row_stride"], (hi ^ (row & form["swz"])) << 4


def ld_lane_k(form: dict, lane: int) -> tuple:  # K tiles and fp8 V tiles (`lk`)
    return ld_lane(form, (lane & 7) + (lane & 8), lane >> 4)


def ld_lane_v(form: dict, lane: int) -> tuple:  # 16-bit V tiles (`lv`)
    return ld_lane(form, (lane & 7) + (lane >> 4) * 8, (lane >> 3) & 1)


def ld_at(form: dict, lane_consts: tuple, u: int) -> int:
    """The kernel's ld_at: byte offset of the lane's ldmatrix row for even unit u."""
    base, x = lane_consts
    return base + (u >> 3) * form["box"] + (((u & 7) << 4) ^ x)


def stage(rows: np.ndarray, esz: int, tma: bool) -> np.ndarray:
    """Lands 16 rows [16, D] as the copies do (one element per esz bytes of shared memory)."""
    form = tile_form(rows.shape[1] * esz, tma)
    flat = np.full((16 * form["row_stride"] + 16 * form["box"]) // esz, np.nan)
    per_unit = 16 // esz
    for j in range(16):
        for u in range(rows.shape[1] // per_unit):
            a = at(form, j, u) // esz
            flat[a : a + per_unit] = rows[j, u * per_unit : (u + 1) * per_unit]
    return flat


def _k_fragment(kf: np.ndarray, form: dict, ks: int, fp8: bool) -> np.ndarray:
    """A fragment [lane, 4, 2] of K rows (keys) x the k step's 16 dims."""
    if not fp8:
        return ldmatrix_x4(kf, lambda lane: ld_at(form, ld_lane_k(form, lane), 2 * ks) // 2)
    # One ldmatrix of units (ks & ~1, + 1) serves two k steps; step ks takes matrices 2t, 2t + 1.
    w = ldmatrix_x4_b8(kf, lambda lane: ld_at(form, ld_lane_k(form, lane), ks & ~1))
    t = ks & 1
    a = np.zeros((32, 4, 2))
    for lane in range(32):
        w0, w1 = w[lane, 2 * t], w[lane, 2 * t + 1]
        a[lane] = [w0[0:2], w1[0:2], w0[2:4], w1[2:4]]
    return a


def _q_fragment(qt: np.ndarray, ks: int, nh: int, fp8: bool) -> tuple:
    b0, b1 = np.zeros((32, 2)), np.zeros((32, 2))
    for lane in range(32):
        r, q = lane >> 2, lane & 3
        row = qt[nh * 8 + r, ks * 16 :]
        o0, o1 = (4 * q, 4 * q + 2) if fp8 else (2 * q, 2 * q + 8)
        b0[lane], b1[lane] = row[o0 : o0 + 2], row[o1 : o1 + 2]
    return b0, b1


def _v_fragments(vf: np.ndarray, form: dict, D: int, fp8: bool) -> list:
    """A fragments [lane, 4, 2] of V^T (dims x keys), one per 16-dim tile (logical rows)."""
    if not fp8:
        return [
            ldmatrix_x4(
                vf, lambda lane, mt=mt: ld_at(form, ld_lane_v(form, lane), 2 * mt) // 2, trans=True
            )
            for mt in range(D // 16)
        ]
    frags = [np.zeros((32, 4, 2)) for _ in range(D // 16)]
    for mt in range(0, D // 16, 2):  # one transposed ldmatrix: units mt, mt + 1
        w = ldmatrix_x4_b8(
            vf, lambda lane, mt=mt: ld_at(form, ld_lane_k(form, lane), mt), trans=True
        )
        for t in range(2):
            for lane in range(32):
                lo = byte_perm(w[lane, 2 * t], [0] * 4, 0x3120)  # key_pairs
                hi = byte_perm(w[lane, 2 * t + 1], [0] * 4, 0x3120)
                frags[mt + t][lane] = [lo[0:2], lo[2:4], hi[0:2], hi[2:4]]
    return frags


def warp_attention(
    q: np.ndarray, ks: list, vs: list, valid: list, fp8: bool, c_out: float, tma: bool = False
) -> tuple:
    """One warp over its chunks: q [8 NH, D] (the staged query tile), ks / vs [16, D] per chunk,
    valid[c][j] whether key j of chunk c is in range (invalid V rows must be zeros, as the kernel
    writes them). Returns the warp's (O [heads, D] unnormalised, m [heads], l [heads]) as the
    merge reads them from shared memory."""
    heads, D = q.shape
    NH = heads // 8
    esz = 1 if fp8 else 2
    form = tile_form(D * esz, tma)
    m = np.full((32, NH, 2), -np.inf)
    lsum = np.zeros((32, NH, 2))
    o = np.zeros((D // 16, NH, 32, 4))
    for kt, vt, ok in zip(ks, vs, valid):
        kf, vf = stage(kt, esz, tma), stage(vt, esz, tma)
        s = np.zeros((NH, 32, 4))
        for k in range(D // 16):
            a = _k_fragment(kf, form, k, fp8)
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
        for mt, a in enumerate(_v_fragments(vf, form, D, fp8)):
            for nh in range(NH):
                mma_16816(
                    o[mt, nh], a, movmatrix_trans(p[nh][:, 0:2]), movmatrix_trans(p[nh][:, 2:4])
                )
    out = np.zeros((heads, D))
    for mt in range(D // 16):
        for nh in range(NH):
            for lane in range(32):
                r, q = lane >> 2, lane & 3
                for e in range(4):
                    out[nh * 8 + 2 * q + (e & 1), out_dim(fp8, mt, r + 8 * (e >> 1))] = o[
                        mt, nh, lane, e
                    ]
    for i in range(3):  # the lane-partial sums, reduced over the lanes of one q
        lsum = lsum + lsum[[lane ^ (4 << i) for lane in range(32)]]
    mh = np.array([m[lane, nh, i] for nh in range(NH) for lane in range(4) for i in range(2)])
    lh = np.array([lsum[lane, nh, i] for nh in range(NH) for lane in range(4) for i in range(2)])
    return out, mh, lh
