"""Float64 numpy reference for the paged KV-cache ops (written independently of the kernels).

Everything here works on dense float64 copies: a paged cache is first decoded to
[num_blocks, block_size, num_kv_heads, head_size], each sequence's keys/values are gathered
through its block table, and attention is a plain masked softmax over the gathered rows.
The CPU and CUDA tests both check the kernels against these functions.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

# ---- fp8 (e4m3fn: bias 7, 3 mantissa bits, no inf, 0x7f = NaN; e5m2: bias 15, 2 bits) -------

_FP8 = {"e4m3": (3, 7), "e5m2": (2, 15)}


def fp8_format(kv_cache_dtype: str) -> str:
    return "e5m2" if kv_cache_dtype == "fp8_e5m2" else "e4m3"


def fp8_decode(codes: np.ndarray, fmt: str) -> np.ndarray:
    """uint8 codes -> float64 values (NaN codes give NaN, e5m2 inf codes give inf)."""
    mbits, bias = _FP8[fmt]
    c = codes.astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> mbits) & ((1 << (7 - mbits)) - 1)
    m = c & ((1 << mbits) - 1)
    frac = m / float(1 << mbits)
    val = np.where(e == 0, frac * 2.0 ** (1 - bias), (1.0 + frac) * 2.0 ** (e - bias))
    if fmt == "e4m3":
        val = np.where((e == 15) & (m == 7), np.nan, val)
    else:
        val = np.where(e == 31, np.where(m == 0, np.inf, np.nan), val)
    return sign * val


def _finite_table(fmt: str) -> tuple[np.ndarray, np.ndarray]:
    codes = np.arange(128, dtype=np.uint8)  # non-negative codes
    vals = fp8_decode(codes, fmt)
    ok = np.isfinite(vals)
    return codes[ok], vals[ok]


def fp8_encode(x: np.ndarray, fmt: str) -> np.ndarray:
    """float -> uint8 by exhaustive search of the nearest finite code (ties to the even code),
    saturating to the largest finite magnitude."""
    codes, vals = _finite_table(fmt)
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.abs(x), vals.max()).reshape(-1, 1)
    dist = np.abs(a - vals.reshape(1, -1))
    best = dist.min(axis=1, keepdims=True)
    # Among equally near codes prefer the one with an even mantissa (lowest bit 0).
    cand = (dist == best) & ((codes & 1) == 0).reshape(1, -1)
    tie_free = (dist == best).sum(axis=1) == 1
    idx = np.where(tie_free, dist.argmin(axis=1), cand.argmax(axis=1))
    out = codes[idx].reshape(x.shape)
    return np.where(np.signbit(x), out | 0x80, out).astype(np.uint8)


# ---- paged caches --------------------------------------------------------------------------


def dense_cache(
    cache: np.ndarray, is_key: bool, layout: str, kv_cache_dtype: str = "auto", scale: float = 1.0
) -> np.ndarray:
    """A paged cache (numpy, any float dtype or uint8 fp8) -> float64
    [num_blocks, block_size, num_kv_heads, head_size]."""
    if kv_cache_dtype == "auto":
        c = cache.astype(np.float64)
    else:
        c = fp8_decode(cache, fp8_format(kv_cache_dtype)) * scale
    if layout == "nhd":
        return c
    if is_key:  # [nb, H, D/x, bs, x] -> [nb, bs, H, D/x, x]
        nb, h, dx, bs, x = c.shape
        return c.transpose(0, 3, 1, 2, 4).reshape(nb, bs, h, dx * x)
    return c.transpose(0, 3, 1, 2)  # [nb, H, D, bs] -> [nb, bs, H, D]


def gather(dense: np.ndarray, table_row: np.ndarray, n: int) -> np.ndarray:
    """The first n tokens of a sequence: [n, num_kv_heads, head_size]."""
    bs = dense.shape[1]
    blocks = np.asarray(table_row[: (n + bs - 1) // bs], dtype=np.int64)
    return dense[blocks].reshape(-1, dense.shape[2], dense.shape[3])[:n]


# ---- attention -----------------------------------------------------------------------------


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    q_pos: np.ndarray,
    scale: float,
    alibi_slopes: Optional[np.ndarray] = None,
    soft_cap: float = 0.0,
    sliding_window: Optional[int] = None,
    causal: bool = True,
) -> np.ndarray:
    """q [Lq, H, D] at positions q_pos; k, v [Lk, KVH, D] at positions 0..Lk-1.
    Key j is visible to query i iff j <= q_pos[i] (and q_pos[i] - j < window); every key is
    visible when not causal. Logit =
    cap * tanh(scale q.k / cap) (if cap > 0) + slope * (j - q_pos[i]). Rows with no visible key
    are 0."""
    lq, h, d = q.shape
    kvh = k.shape[1]
    g = h // kvh
    k = np.repeat(k.astype(np.float64), g, axis=1)
    v = np.repeat(v.astype(np.float64), g, axis=1)
    s = np.einsum("ihd,jhd->hij", q.astype(np.float64), k) * scale
    if soft_cap > 0:
        s = soft_cap * np.tanh(s / soft_cap)
    kpos = np.arange(k.shape[0])
    rel = kpos[None, :] - q_pos[:, None]  # [Lq, Lk]
    if alibi_slopes is not None:
        s = s + np.asarray(alibi_slopes, np.float64)[:, None, None] * rel[None]
    mask = (rel <= 0) | (not causal)
    if sliding_window is not None and sliding_window > 0:
        mask &= rel > -sliding_window
    s = np.where(mask[None], s, -np.inf)
    m = s.max(axis=2, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.where(mask[None], np.exp(s - m), 0.0)
    denom = p.sum(axis=2, keepdims=True)
    p = p / np.where(denom > 0, denom, 1.0)
    return np.einsum("hij,jhd->ihd", p, v)


def decode(
    query: np.ndarray,
    k_dense: np.ndarray,
    v_dense: np.ndarray,
    block_tables: np.ndarray,
    seq_lens: np.ndarray,
    scale: float,
    **kw,
) -> np.ndarray:
    """Reference of paged_attention_v1/v2: query [S, H, D] is the last token of each sequence."""
    out = np.zeros(query.shape, np.float64)
    for i, n in enumerate(np.asarray(seq_lens)):
        n = int(n)
        if n == 0:
            continue
        k = gather(k_dense, block_tables[i], n)
        v = gather(v_dense, block_tables[i], n)
        out[i] = attention(query[i : i + 1], k, v, np.array([n - 1]), scale, **kw)[0]
    return out


def prefix_prefill(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    k_dense: np.ndarray,
    v_dense: np.ndarray,
    block_tables: np.ndarray,
    query_start_loc: np.ndarray,
    seq_lens: np.ndarray,
    scale: float,
    **kw,
) -> np.ndarray:
    """Reference of context_attention_fwd: each sequence's new tokens follow its cached
    context (context_len = seq_len - query_len) and attend causally (or, with causal=False in
    kw, to the whole sequence)."""
    out = np.zeros(query.shape, np.float64)
    for i in range(len(seq_lens)):
        q0, q1 = int(query_start_loc[i]), int(query_start_loc[i + 1])
        ctx = int(seq_lens[i]) - (q1 - q0)
        k = np.concatenate([gather(k_dense, block_tables[i], ctx), key[q0:q1]])
        v = np.concatenate([gather(v_dense, block_tables[i], ctx), value[q0:q1]])
        out[q0:q1] = attention(query[q0:q1], k, v, ctx + np.arange(q1 - q0), scale, **kw)
    return out


def rel_error(out: np.ndarray, ref: np.ndarray) -> float:
    out = np.asarray(out, np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))
