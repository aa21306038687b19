"""BlockAllocator / hash_block arguments of a wrong type or range raise errors naming the
argument (they gave nanobind's "incompatible function arguments" dump of the signature)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
from pagedkv import _C, BlockAllocator

Call = Callable[[BlockAllocator, list[int]], Any]

BAD: dict[str, tuple[Call, type, str]] = {
    "fork_float_id": (
        lambda a, ids: a.fork([1.0]),
        TypeError,
        "ids must be a sequence of int block ids, got list",
    ),
    "free_str": (lambda a, ids: a.free("01"), TypeError, "ids must be a sequence"),
    "free_none": (lambda a, ids: a.free(None), TypeError, "ids must be a sequence"),
    "swap_in_float": (lambda a, ids: a.swap_in([0.5]), TypeError, "cpu_ids must be a sequence"),
    "ref_count_float": (
        lambda a, ids: a.ref_count(1.5),
        TypeError,
        "id must be an integer, got float",
    ),
    "cow_huge": (lambda a, ids: a.copy_on_write(2**70), ValueError, "id = 1180591620717411303424"),
    "allocate_float": (lambda a, ids: a.allocate(2.0), TypeError, "n must be an integer"),
    "match_extra_key_negative": (
        lambda a, ids: a.match_prefix([1, 2, 3, 4], extra_key=-1),
        ValueError,
        r"extra_key = -1 is out of range: it must be in",
    ),
    "peek_extra_key_str": (
        lambda a, ids: a.peek_prefix([1], extra_key="k"),
        TypeError,
        "extra_key must be an integer, got str",
    ),
    "match_cap_float": (
        lambda a, ids: a.match_prefix([1], max_blocks=1.5),
        TypeError,
        "max_blocks must be an integer",
    ),
    "partial_cap_huge": (
        lambda a, ids: a.match_prefix_partial([1], max_tokens=2**70),
        ValueError,
        "max_tokens",
    ),
    "cache_parent_short": (
        lambda a, ids: a.cache_full_block(ids[0], (1,), [1, 2, 3, 4]),
        TypeError,
        r"parent must be None or a \(lo, hi\) tuple",
    ),
    "cache_parent_negative": (
        lambda a, ids: a.cache_full_block(ids[0], (-1, 0), [1, 2, 3, 4]),
        TypeError,
        "parent must be None",
    ),
    "cache_id_str": (
        lambda a, ids: a.cache_full_block("0", None, [1, 2, 3, 4]),
        TypeError,
        "id must be an integer, got str",
    ),
    "hash_extra_key_negative": (
        lambda a, ids: _C.hash_block(None, [1], -1),
        ValueError,
        "extra_key",
    ),
    "hash_parent_str": (
        lambda a, ids: BlockAllocator.hash_block("root", [1]),
        TypeError,
        "parent must be None",
    ),
    "ctor_blocks_float": (
        lambda a, ids: BlockAllocator(8.0, 4),
        TypeError,
        "num_blocks must be an integer",
    ),
    "ctor_cpu_huge": (
        lambda a, ids: BlockAllocator(8, 4, num_cpu_blocks=2**64),
        ValueError,
        "num_cpu_blocks",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_argument_names_itself_and_changes_nothing(case: str) -> None:
    call, exc, message = BAD[case]
    a = BlockAllocator(8, 4, num_cpu_blocks=2)
    ids = a.allocate(2)
    before = (a.stats(), [a.ref_count(i) for i in range(8)])
    with pytest.raises(exc, match=message):
        call(a, ids)
    assert (a.stats(), [a.ref_count(i) for i in range(8)]) == before
    assert a.check_invariants() == ""


def test_integer_like_arguments_still_work() -> None:
    a = BlockAllocator(np.int64(8), np.int32(4), num_cpu_blocks=np.uint8(2))
    ids = a.allocate(np.int64(2))
    h = a.cache_full_block(np.int32(ids[0]), None, [1, 2, 3, 4], extra_key=np.uint64(2**64 - 1))
    assert a.block_hash(np.int64(ids[0])) == h
    assert a.peek_prefix([1, 2, 3, 4, 5], extra_key=2**64 - 1, max_blocks=np.int8(1)) == 1
    child = a.cache_full_block(ids[1], h, [5, 6, 7, 8])
    assert child == _C.hash_block(h, [5, 6, 7, 8])
    assert a.match_prefix_partial([1, 2, 3, 4, 5], extra_key=2**64 - 1, max_tokens=None)[1] == 4
