"""CPU check of the tensor-core decode kernel's index arithmetic through its lane-level Python
model (decode_mma_model.py): random head sizes, block sizes, layouts (NHD, vLLM x-split keys and
[d][slot] values), fp8 / 16-bit element sizes, windows, partitions that cut 16-key chunks, GQA
groups over 16; stale cache slots hold NaN. The GPU itself is tested in test_decode_mma_cuda.py."""

from __future__ import annotations

import random

import numpy as np
import pytest
from support.decode_mma_emulator import (
    ceil_div,
    chunk_fragments,
    layout_of,
    plan,
    reference,
    run_cta,
)


def _cache(rng, nb, bs, hkv, D, layout, is_value, esz):
    """A cache in `layout` with NaN everywhere; returns (flat array, Layout, writer)."""
    x = 16 // esz
    if layout == "nhd":
        shape = (nb, bs, hkv, D)
    elif is_value:
        shape = (nb, hkv, D, bs)
    else:
        shape = (nb, hkv, D // x, bs, x)
    arr = np.full(shape, np.nan)
    strides = tuple(s // arr.itemsize for s in arr.strides)

    def write(block, slot, head, vec):
        if layout == "nhd":
            arr[block, slot, head] = vec
        elif is_value:
            arr[block, head, :, slot] = vec
        else:
            arr[block, head, :, slot, :] = vec.reshape(D // x, x)

    return arr, layout_of(shape, strides, layout == "vllm", is_value), write


@pytest.mark.parametrize("trial", range(6))
def test_model_matches_reference(trial):
    seed = random.randrange(1 << 30)
    r, rng = random.Random(seed), np.random.default_rng(seed)
    D = r.choice([32, 64, 80, 96, 128, 192, 256])
    esz = r.choice([1, 2])
    layout = r.choice(["nhd", "vllm"])
    bs = r.choice([8, 16, 32] if not (esz == 1 and layout == "vllm") else [16, 32])
    hkv, group = r.choice([1, 2]), r.choice([1, 4, 20])
    seq_len = r.choice([1, 16, 17, r.randint(1, 300)])
    window = r.choice([0, 0, r.randint(1, 120)])
    partition = r.choice([0, 0, bs, 3 * bs, 128])
    softcap = r.choice([0.0, 15.0])
    alibi = rng.random(hkv * group) * 0.2 if r.random() < 0.4 else None
    nblk = ceil_div(max(seq_len, 1), bs)
    nb = nblk + 3
    kc, kl, kw = _cache(rng, nb, bs, hkv, D, layout, False, esz)
    vc, vl, vw = _cache(rng, nb, bs, hkv, D, layout, True, esz)
    table = np.array(rng.permutation(nb)[:nblk].tolist() + [nb + 5], dtype=np.int64)  # + bad id
    keys = rng.standard_normal((hkv, seq_len, D))
    vals = rng.standard_normal((hkv, seq_len, D))
    for t in range(seq_len):
        for h in range(hkv):
            kw(table[t // bs], t % bs, h, keys[h, t])
            vw(table[t // bs], t % bs, h, vals[h, t])
    assert plan(D, esz, kl, vl, bs) is not None
    q = rng.standard_normal((hkv * group, D))
    scale = D**-0.5
    parts = ceil_div(seq_len, partition) if partition else 1
    for kvh in range(hkv):
        for g0 in range(0, group, 16):
            ng = min(16, group - g0)
            heads = slice(kvh * group + g0, kvh * group + g0 + ng)
            a = None if alibi is None else alibi[heads]
            res = [
                run_cta(
                    q,
                    kc.ravel(),
                    vc.ravel(),
                    kl,
                    vl,
                    esz,
                    table,
                    nb,
                    bs,
                    seq_len,
                    kvh,
                    g0,
                    group,
                    scale,
                    softcap=softcap,
                    alibi=alibi,
                    window=window,
                    partition=partition,
                    part=p,
                )
                for p in range(parts)
            ]
            ref = reference(q[heads], keys[kvh], vals[kvh], seq_len, scale, softcap, a, window)
            if not partition:
                out = res[0][0]
            else:  # vLLM's reduction over the written partitions
                mx = np.max([m for _, m, _ in res], axis=0)
                w = [
                    np.where(m == -np.inf, 0, lsum * np.exp2(m - np.where(mx == -np.inf, 0, mx)))
                    for _, m, lsum in res
                ]
                tot = np.sum(w, axis=0)
                out = np.sum([o * wi[:, None] for (o, _, _), wi in zip(res, w)], axis=0)
                out = np.where(tot[:, None] > 0, out / np.where(tot > 0, tot, 1)[:, None], 0)
                for p, (o, _, _) in enumerate(res):  # each partition alone
                    lo, hi = p * partition, min(seq_len, (p + 1) * partition)
                    start = max(lo, seq_len - window) if window else lo
                    if start < hi:
                        part_ref = reference(
                            q[heads],
                            keys[kvh],
                            vals[kvh],
                            seq_len,
                            scale,
                            softcap,
                            a,
                            window,
                            lo,
                            hi,
                        )
                        assert np.abs(o - part_ref).max() < 1e-9, (seed, p)
            assert np.isfinite(out).all(), seed
            assert np.abs(out - ref).max() < 1e-9, (
                seed,
                D,
                esz,
                layout,
                bs,
                seq_len,
                window,
                partition,
            )


@pytest.mark.parametrize("D", [32, 80, 128, 256])
@pytest.mark.parametrize("v_trans", [False, True])
def test_fragment_expressions(D, v_trans):
    """The kernel's ldmatrix addresses, mma operand order, S element positions, P re-packing and
    output staging (transcribed in decode_mma_model.chunk_fragments) give S = Q K^T and O = S V
    for both value tiles ([key][d] through ldmatrix.trans, [d][key] through plain ldmatrix)."""
    rng = np.random.default_rng()
    k_pitch, v_pitch = D + 8, (24 if v_trans else D + 8)
    qs, kt = np.full((16, k_pitch), np.nan), np.full((16, k_pitch), np.nan)
    qs[:, :D], kt[:, :D] = rng.standard_normal((16, D)), rng.standard_normal((16, D))
    v = rng.standard_normal((16, D))  # [key][d]
    vt = np.full((D, v_pitch) if v_trans else (16, v_pitch), np.nan)
    if v_trans:
        vt[:, :16] = v.T
    else:
        vt[:, :D] = v
    s, o = chunk_fragments(qs, kt, vt, D, k_pitch, v_pitch, v_trans)
    np.testing.assert_allclose(s, qs[:, :D] @ kt[:, :D].T, atol=1e-9)
    np.testing.assert_allclose(o, s @ v, atol=1e-9)
