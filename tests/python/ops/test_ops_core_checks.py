"""Core checks from issue #25: sizes of get_kv_cache_shape (negative, zero, floats), negative
token ids in cache_full_block, and a big-endian array named as such (it used to read "must be
an array ... got ndarray")."""

from __future__ import annotations

import numpy as np
import pytest
from pagedkv import PagedAttention, ops
from pagedkv._C import BlockAllocator


@pytest.mark.parametrize(
    "args, error, match",
    [
        ((-1, 16, 2, 64), ValueError, "^num_blocks must be a positive integer, got -1"),
        ((0, 16, 2, 64), ValueError, "^num_blocks must be a positive integer, got 0"),
        ((4, 16, -2, 64), ValueError, "^num_kv_heads must be a positive integer"),
        ((4.0, 16, 2, 64), TypeError, "^num_blocks must be an integer, got float"),
        ((4, 16.5, 2, 64), TypeError, "^block_size must be an integer, got float"),
        ((4, 16, 2, True), TypeError, "^head_size must be an integer, got bool"),
    ],
)
def test_kv_cache_shape_sizes_are_positive_integers(args, error, match):
    with pytest.raises(error, match=match):
        PagedAttention.get_kv_cache_shape(*args)
    assert PagedAttention.get_kv_cache_shape(np.int64(4), 16, 2, 64) == (2, 4, 16 * 2 * 64)


def test_cache_full_block_refuses_negative_token_ids():
    a = BlockAllocator(8, 4)
    (block,) = a.allocate(1)
    with pytest.raises(
        ValueError, match="^tokens must be non-negative token ids, got -2 at index 1"
    ):
        a.cache_full_block(block, None, [1, -2, 3, 4])
    a.cache_full_block(block, None, [1, 2, 3, 4])


def test_big_endian_arrays_are_named_as_such():
    kc = np.zeros((4, 2, 4, 8, 4), np.float32)
    vc = np.zeros((4, 2, 16, 8), np.float32)
    mapping = np.array([[0, 1]], dtype=">i8")
    with pytest.raises(TypeError, match=r"^block_mapping is a big-endian array \(dtype >i8\)"):
        ops.copy_blocks([kc], [vc], mapping)
    ops.copy_blocks([kc], [vc], mapping.astype(mapping.dtype.newbyteorder("=")))
