"""CPU check of the BM-128 prefill kernel's control flow through its warp-tile-level Python model
(prefill_mma_model.py): random head sizes (all instantiations, padded ones too), GQA groups that
split tokens across query tiles, cached prefixes, ragged sequences, windows, alibi, soft-cap, and
a max_query_len larger than needed. Every (token, head) must be written exactly once and match a
float64 reference; and, at lane level, the fragment index expressions of every warp's tiles.
The kernel itself is tested on a GPU in test_prefill_mma_cuda.py."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from pagedkv import ops
from support.prefill_mma_emulator import Problem, bf16, padded_head, reference, run


def _problem(r: random.Random, rng: np.random.Generator) -> tuple[Problem, int]:
    d = r.choice(ops.SUPPORTED_HEAD_SIZES)
    g, hkv, n = r.choice([1, 2, 3, 4, 8]), r.choice([1, 2]), r.randint(1, 3)
    ctx = [r.choice([0, r.randint(1, 300)]) for _ in range(n)]
    qlen = [r.randint(1, 300) for _ in range(n)]
    qsl = [0, *itertools.accumulate(qlen)]
    sl = [c + x for c, x in zip(ctx, qlen)]

    def kv() -> list[list[np.ndarray]]:
        return [[bf16(rng.standard_normal((sl[s], d))) for _ in range(hkv)] for s in range(n)]

    pb = Problem(
        q=bf16(rng.standard_normal((qsl[-1], g * hkv, d))),
        keys=kv(),
        values=kv(),
        qsl=qsl,
        seq_lens=sl,
        group=g,
        num_kv_heads=hkv,
        scale=d**-0.5,
        alibi=(rng.random(g * hkv) * 0.2).astype(np.float32) if r.random() < 0.3 else None,
        softcap=r.choice([0.0, 0.0, 30.0, 5.0]),
        window=r.choice([0, 0, r.randint(1, 64), r.randint(1, 400)]),
    )
    return pb, max(qlen) + r.choice([0, 0, 7])


@pytest.mark.parametrize("trial", range(4))
def test_model_matches_reference(trial):
    seed = random.randrange(1 << 30)
    r, rng = random.Random(seed), np.random.default_rng(seed)
    for _ in range(6):
        pb, max_q = _problem(r, rng)
        out, written = run(pb, max_q)
        case = (seed, pb.q.shape, pb.group, pb.seq_lens, pb.qsl, pb.window, pb.softcap)
        assert (written == 1).all(), ("rows written", written.min(), written.max(), case)
        assert np.isfinite(out).all(), case
        assert np.abs(out - reference(pb)).max() < 0.05, case


def test_padded_head_dispatch():
    assert [padded_head(d) for d in (32, 64, 80, 96, 112, 120, 128, 192, 256)] == [
        32,
        64,
        80,
        96,
        112,
        128,
        128,
        192,
        256,
    ]


@pytest.mark.parametrize("dp", [64, 80, 192])
def test_fragment_indexing(dp):
    """The kernel's ldmatrix addresses, mma operand order, P re-packing and output staging (as
    transcribed in prefill_mma_model.warp_tile) give Q K^T and P V for every warp's rows."""
    from support.prefill_mma_emulator import tile_shape, warp_tile

    rng = np.random.default_rng()
    mt_, bm, bn = tile_shape(dp)
    ld = dp + 8
    sq, tk, tv = (np.zeros((n, ld)) for n in (bm, bn, bn))
    for t in (sq, tk, tv):
        t[:, :dp] = rng.standard_normal((t.shape[0], dp))
    for warp in range(4):
        s, so = warp_tile(sq, tk, tv, warp, mt_, ld)
        rows = sq[warp * mt_ * 16 : (warp + 1) * mt_ * 16, :dp]
        np.testing.assert_allclose(s, rows @ tk[:, :dp].T, atol=1e-9)
        np.testing.assert_allclose(so[:, :dp], s @ tv[:, :dp], atol=1e-9)
