"""A warp-tile-level Python model of the BM-128 tensor-core prefill kernel
(src/ops/cuda/prefill_mma_kernel.cuh), for checking its control flow without a GPU: the CTA order
(prefill_order.cuh: a few (sequence, KV head) pairs at a time, each one's last query tile
first), the query-tile / key-range arithmetic (k_lo, k_hi under causal masks and sliding
windows), the zero fill past k_hi and in the head-size padding, the per-warp decisions (skip a
key tile; plain, position-masked or general tiles) and the online softmax in the log2 domain with
the scale folded into the exponent. The tensor-core steps are float32 matrix products of whole
warp tiles and P is rounded to bf16 as the kernel packs it. The paged-cache addressing is not
modelled (the H100 tests cover it): keys are given per sequence as context + new tokens.
At lane level (warp_tile), the kernel's ldmatrix addresses, mma operand order, P re-packing and
output staging run under PTX's ldmatrix / mma.m16n8k16 fragment semantics. Mirrors the kernel's
names and index expressions; keep them in step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from support.ptx_fragments import ldmatrix_x4, mma_16816

L2E = 1.4426950408889634


@dataclass
class Problem:
    q: np.ndarray  # [num_q, num_heads, head_size] float32 (bf16 values)
    keys: list[list[np.ndarray]]  # [seq][kv_head] -> [seq_len, head_size] (context + new)
    values: list[list[np.ndarray]]
    qsl: list[int]  # query_start_loc [num_seqs + 1]
    seq_lens: list[int]
    group: int
    num_kv_heads: int
    scale: float
    alibi: Optional[np.ndarray]  # [num_heads] or None
    softcap: float
    window: int
    causal: bool = True  # False: every query sees its whole sequence (window 0)


def last_key(pb: Problem, ctx: int, gr, rows: int):  # noqa: ANN001, ANN201 - int or array
    """prefill_softmax.cuh: the last key packed row gr sees (its own position, or the
    sequence's last when not causal)."""
    return ctx + np.where(pb.causal, gr, rows - 1) // pb.group


def tile_shape(dp: int) -> tuple[int, int, int]:
    """prefill_tile.cuh's Tile: (MT, BM, BN) for the padded head size."""
    mt = 2 if dp <= 128 else 1
    return mt, 4 * 16 * mt, 64 if dp <= 128 else 32


def padded_head(d: int) -> int:
    """launch_typed's dispatch: the instantiated head size that serves d."""
    for dp in (32, 64, 80, 96, 112, 128, 192, 256):
        if d <= dp and (dp != 128 or d in (120, 128)):
            return dp
    raise ValueError(d)


def bf16(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even to bfloat16, kept as float32."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def tile_slot(cta: int, ranks: int) -> tuple[int, int]:
    """prefill_order.cuh: the (sequence, KV head) pair and rank (0 = last tile) of CTA `cta`,
    the pairs taken one at a time."""
    return cta // ranks, cta % ranks


def run(pb: Problem, max_query_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's output (NaN where unwritten) and how often each (token, head) was written,
    with CTAs taking the (sequence, KV head) pairs one at a time (prefill_order.cuh)."""
    num_q, _, d = pb.q.shape
    dp = padded_head(d)
    mt_, bm, bn = tile_shape(dp)
    g, hkv, nseq = pb.group, pb.num_kv_heads, len(pb.seq_lens)
    out = np.full(pb.q.shape, np.nan, np.float32)
    written = np.zeros(pb.q.shape[:2], int)
    tiles = max(1, (max_query_len * g + bm - 1) // bm)
    pairs = nseq * hkv
    extras = pb.softcap > 0 or pb.alibi is not None or not pb.scale > 0
    for bid in range(tiles * pairs):  # blockIdx.x
        pair, rank = tile_slot(bid, tiles)
        seq, kvh = pair // hkv, pair % hkv
        qs = min(max(pb.qsl[seq], 0), num_q)
        qlen = min(pb.qsl[seq + 1], num_q) - qs
        rows = qlen * g
        tile = (rows + bm - 1) // bm - 1 - rank
        if tile < 0:
            continue
        r0 = tile * bm
        ctx = pb.seq_lens[seq] - qlen
        k_hi = ctx + (min(r0 + bm, rows) - 1) // g + 1 if pb.causal else ctx + qlen
        k_lo = max(0, ctx + r0 // g - pb.window + 1) if pb.window > 0 else 0
        n_tiles = (k_hi - k_lo + bn - 1) // bn if k_hi > k_lo else 0
        sq = np.zeros((bm, dp), np.float32)  # load_q
        for r in range(min(bm, rows - r0)):
            gr = r0 + r
            sq[r, :d] = pb.q[qs + gr // g, kvh * g + gr % g]

        def load_rows(
            src: list[list[np.ndarray]], kt: int, seq: int = seq, kvh: int = kvh, k_hi: int = k_hi
        ) -> np.ndarray:
            t = np.zeros((bn, dp), np.float32)  # zeros past k_hi and in the padding
            n = max(0, min(bn, k_hi - kt))
            t[:n, :d] = src[seq][kvh][kt : kt + n]
            return t

        for warp in range(4):
            _warp(
                pb,
                out,
                written,
                sq,
                load_rows,
                warp,
                mt_,
                bn,
                r0,
                rows,
                ctx,
                kvh,
                qs,
                k_lo,
                n_tiles,
                extras,
                d,
            )
    return out, written


def _warp(
    pb, out, written, sq, load_rows, warp, mt_, bn, r0, rows, ctx, kvh, qs, k_lo, n_tiles, extras, d
):  # noqa: ANN001 - mirrors the kernel's locals
    g, nrow = pb.group, mt_ * 16
    wr0 = r0 + warp * nrow
    warp_live = wr0 < rows
    w_qmin = last_key(pb, ctx, wr0, rows)
    w_qmax = last_key(pb, ctx, min(wr0 + nrow, rows) - 1, rows)
    gr = wr0 + np.arange(nrow)
    o = np.zeros((nrow, sq.shape[1]), np.float32)
    m = np.full(nrow, -np.inf, np.float32)
    l_ = np.zeros(nrow, np.float32)
    for it in range(n_tiles):
        kt = k_lo + it * bn
        live = (
            warp_live and kt <= w_qmax and not (pb.window > 0 and kt + bn - 1 <= w_qmin - pb.window)
        )
        plain = not extras and kt + bn - 1 <= w_qmin and (pb.window <= 0 or kt > w_qmax - pb.window)
        if not live:
            continue
        k, v = load_rows(pb.keys, kt), load_rows(pb.values, kt)
        s = sq[warp * nrow : (warp + 1) * nrow] @ k.T
        q_pos = ctx + gr // g
        key = kt + np.arange(bn)
        masked = key[None, :] > last_key(pb, ctx, gr, rows)[:, None]
        if pb.window > 0:
            masked |= key[None, :] <= q_pos[:, None] - pb.window
        if plain:  # prefill_softmax.cuh: TileKind::kPlain
            mul = np.float32(pb.scale * L2E)
            mx = np.maximum(m, s.max(1) * mul)
        elif not extras:  # kPositions: raw scores, -inf outside each row's range
            mul = np.float32(pb.scale * L2E)
            s = np.where(masked, -np.inf, s).astype(np.float32)
            mx = np.maximum(m, s.max(1) * mul)
        else:  # kGeneral
            mul = np.float32(1.0)
            slope = np.zeros(nrow, np.float32)
            if pb.alibi is not None:
                ok = gr < rows
                slope[ok] = pb.alibi[kvh * g + gr[ok] % g]
            x = s * np.float32(pb.scale)
            if pb.softcap > 0:
                x = pb.softcap * np.tanh(x / pb.softcap)
            x = (x + slope[:, None] * (key[None, :] - q_pos[:, None])) * L2E
            s = np.where(masked, -np.inf, x).astype(np.float32)
            mx = np.maximum(m, s.max(1))
        ms = np.where(mx == -np.inf, 0, mx).astype(np.float32)
        alpha = np.exp2(m - ms)
        m = mx
        p = np.exp2(s * mul - ms[:, None]).astype(np.float32)
        l_ = l_ * alpha + p.sum(1)
        o = o * alpha[:, None] + bf16(p) @ v
    inv = np.where(l_ > 0, 1 / np.where(l_ > 0, l_, 1), 0)
    for r in range(nrow):
        if gr[r] < rows:
            tok, head = qs + gr[r] // g, kvh * g + gr[r] % g
            out[tok, head] = o[r, :d] * inv[r]
            written[tok, head] += 1


def reference(pb: Problem) -> np.ndarray:
    """float64 causal (or, with pb.causal False, bidirectional) attention with the same
    options."""
    outs = []
    for s in range(len(pb.seq_lens)):
        qlen = pb.qsl[s + 1] - pb.qsl[s]
        ctx = pb.seq_lens[s] - qlen
        qq = pb.q[pb.qsl[s] : pb.qsl[s + 1]].astype(np.float64)
        o = np.zeros_like(qq)
        for h in range(qq.shape[1]):
            k = pb.keys[s][h // pb.group].astype(np.float64)
            v = pb.values[s][h // pb.group].astype(np.float64)
            lg = qq[:, h] @ k.T * pb.scale
            if pb.softcap > 0:
                lg = pb.softcap * np.tanh(lg / pb.softcap)
            rel = np.arange(k.shape[0])[None] - (ctx + np.arange(qlen))[:, None]
            if pb.alibi is not None:
                lg = lg + pb.alibi[h] * rel
            mask = (rel > 0) & pb.causal
            if pb.window > 0:
                mask |= rel <= -pb.window
            lg = np.where(mask, -np.inf, lg)
            p = np.exp(lg - lg.max(1, keepdims=True))
            o[:, h] = (p / p.sum(1, keepdims=True)) @ v
        outs.append(o)
    return np.concatenate(outs)


# ---- lane level: the kernel's fragment index expressions under PTX's ldmatrix / mma semantics


def warp_tile(
    sq: np.ndarray, tk: np.ndarray, tv: np.ndarray, warp: int, mt_: int, ld: int
) -> tuple[np.ndarray, np.ndarray]:
    """One warp's S = Q K^T and (S as P) V through the kernel's ldmatrix addressing, mma operand
    order, P re-packing and output staging; returns (S [rows, BN], staged O [rows, LD])."""
    dp, bn = ld - 8, tk.shape[0]
    fq, fk, fv = sq.reshape(-1), tk.reshape(-1), tv.reshape(-1)
    qw = warp * mt_ * 16 * ld
    s = np.zeros((mt_, bn // 8, 32, 4))
    for kk in range(dp // 16):
        a = [
            ldmatrix_x4(
                fq,
                lambda ln, mt=mt, kk=kk: qw + (mt * 16 + (ln & 15)) * ld + kk * 16 + (ln >> 4) * 8,
            )
            for mt in range(mt_)
        ]
        for nb in range(bn // 16):
            b = ldmatrix_x4(
                fk,
                lambda ln, nb=nb, kk=kk: (
                    (nb * 16 + (ln >> 4) * 8 + (ln & 7)) * ld + kk * 16 + ((ln >> 3) & 1) * 8
                ),
            )
            for mt in range(mt_):
                mma_16816(s[mt, 2 * nb], a[mt], b[:, 0], b[:, 1])
                mma_16816(s[mt, 2 * nb + 1], a[mt], b[:, 2], b[:, 3])
    o = np.zeros((mt_, dp // 8, 32, 4))
    for kk in range(bn // 16):
        a = [
            np.stack(
                [
                    s[mt, 2 * kk, :, 0:2],
                    s[mt, 2 * kk, :, 2:4],
                    s[mt, 2 * kk + 1, :, 0:2],
                    s[mt, 2 * kk + 1, :, 2:4],
                ],
                axis=1,
            )
            for mt in range(mt_)
        ]
        for nd in range(dp // 16):
            b = ldmatrix_x4(
                fv,
                lambda ln, kk=kk, nd=nd: (
                    (kk * 16 + ((ln >> 3) & 1) * 8 + (ln & 7)) * ld + nd * 16 + (ln >> 4) * 8
                ),
                trans=True,
            )
            for mt in range(mt_):
                mma_16816(o[mt, 2 * nd], a[mt], b[:, 0], b[:, 1])
                mma_16816(o[mt, 2 * nd + 1], a[mt], b[:, 2], b[:, 3])
    s_rows, so = np.zeros((mt_ * 16, bn)), np.full((mt_ * 16, ld), np.nan)
    for i in range(2 * mt_):
        mt, h = i >> 1, i & 1
        for lane in range(32):
            r, col = mt * 16 + lane // 4 + 8 * h, 2 * (lane & 3)
            for n in range(dp // 8):
                so[r, n * 8 + col : n * 8 + col + 2] = o[mt, n, lane, 2 * h : 2 * h + 2]
            for n in range(bn // 8):
                s_rows[r, n * 8 + col : n * 8 + col + 2] = s[mt, n, lane, 2 * h : 2 * h + 2]
    return s_rows, so
