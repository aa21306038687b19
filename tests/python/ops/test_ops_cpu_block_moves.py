"""copy_blocks / swap_blocks: pairs run in the order given, as a sequential loop would.

The scheduler's plan lists copies in the order they were recorded (support/scheduler_checks
replays them that way), and cache_ops.cpp promises chained pairs (a -> b, then b -> c) behave
like a loop. test_ops_cpu.py's mappings never chain, so mutation testing found that running the
pairs backwards passed it.
"""

from __future__ import annotations

import numpy as np
import pytest
from pagedkv import PagedAttention, ops


def _sequential(cache: np.ndarray, pairs: list[tuple[int, int]]) -> np.ndarray:
    want = cache.copy()
    for s, d in pairs:
        want[:, d] = want[:, s]
    return want


@pytest.mark.parametrize("pairs", [[(1, 2), (2, 3)], [(2, 3), (1, 2)], [(0, 4), (4, 0), (3, 4)]])
def test_copy_blocks_runs_chained_pairs_in_order(pairs: list[tuple[int, int]]) -> None:
    rng = np.random.default_rng(len(pairs) * 10 + pairs[0][0])
    caches = [rng.standard_normal((2, 5, 3 * 16)).astype(np.float32) for _ in range(2)]
    want = [_sequential(c, pairs) for c in caches]
    PagedAttention.copy_blocks(caches, np.array(pairs, np.int64))
    for got, w in zip(caches, want):
        np.testing.assert_array_equal(got, w)


def test_copy_blocks_key_and_value_caches_of_every_layer() -> None:
    rng = np.random.default_rng(3)
    keys = [rng.standard_normal((6, 4, 8)).astype(np.float32) for _ in range(3)]
    values = [rng.standard_normal((6, 4, 8)).astype(np.float32) for _ in range(3)]
    pairs = [(5, 0), (0, 1)]
    want_k = [_sequential(k[None], pairs)[0] for k in keys]
    want_v = [_sequential(v[None], pairs)[0] for v in values]
    ops.copy_blocks(keys, values, np.array(pairs, np.int64))
    for got, w in zip(keys + values, want_k + want_v):
        np.testing.assert_array_equal(got, w)


def test_swap_blocks_every_pair() -> None:
    rng = np.random.default_rng(4)
    src = rng.standard_normal((7, 2, 16)).astype(np.float32)
    dst = np.full((4, 2, 16), -1.0, np.float32)
    pairs = np.array([[6, 0], [0, 3], [2, 1]], np.int64)
    ops.swap_blocks(src, dst, pairs)
    np.testing.assert_array_equal(dst[[0, 3, 1]], src[[6, 0, 2]])
    assert (dst[2] == -1.0).all()


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_cache_write_keeps_nan_and_saturates_infinity(fmt: str) -> None:
    """A NaN key must stay NaN in an fp8 cache (mutation testing: writing e4m3's largest finite
    code 0x7e, i.e. 448, for NaN passed every test); +-inf saturates to +-max finite."""
    from support import reference_attention as ref

    vals = np.array([np.nan, np.inf, -np.inf, 1.0, -np.nan], np.float32)
    key = np.repeat(vals, 16).reshape(5, 1, 16)
    kc = np.zeros((5, 1, 1, 16), np.uint8)
    vc = kc.copy()
    ops.reshape_and_cache_flash(key, key, kc, vc, np.arange(5, dtype=np.int64), fmt, 1.0, 1.0)
    for cache in (kc, vc):
        back = ref.fp8_decode(cache.reshape(5, 16), ref.fp8_format(fmt))
        maxv = 448.0 if fmt == "fp8_e4m3" else 57344.0
        assert np.isnan(back[[0, 4]]).all()
        assert (back[1] == maxv).all() and (back[2] == -maxv).all() and (back[3] == 1.0).all()
