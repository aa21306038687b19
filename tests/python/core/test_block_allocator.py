"""BlockAllocator through Python: pool, errors, copy-on-write, swap, prefix cache, counters."""

from __future__ import annotations

import random

import numpy as np
import pytest
from pagedkv import BlockAllocator
from pagedkv._C import ROOT_BLOCK_HASH, hash_block


def cache_chain(a: BlockAllocator, tokens: list[int], extra_key: int = 0) -> list[int]:
    """Allocates and registers one block per full block of `tokens` (as a scheduler would)."""
    bs = a.block_size
    ids = a.allocate(len(tokens) // bs)
    parent = None
    for i, b in enumerate(ids):
        parent = a.cache_full_block(b, parent, tokens[i * bs : (i + 1) * bs], extra_key)
    return ids


def test_allocate_free_counts() -> None:
    a = BlockAllocator(10, 16)
    assert (a.num_blocks, a.block_size, a.num_free_blocks) == (10, 16, 10)
    ids = a.allocate(4)
    assert len(set(ids)) == 4 and all(0 <= i < 10 for i in ids)
    assert a.num_used_blocks == 4 and a.num_free_blocks == 6
    assert a.usage == pytest.approx(0.4)
    assert all(a.ref_count(i) == 1 for i in ids)
    a.free(ids)
    assert a.num_free_blocks == 10 and a.num_used_blocks == 0
    assert a.allocate(0) == []
    assert a.check_invariants() == ""


def test_allocate_more_than_free_raises_memory_error_and_allocates_nothing() -> None:
    a = BlockAllocator(3, 4)
    a.allocate(2)
    with pytest.raises(MemoryError, match="2 blocks requested, only 1 free"):
        a.allocate(2)
    with pytest.raises(MemoryError):
        a.allocate(2**40)
    assert a.num_free_blocks == 1


def test_numpy_ids_and_scalars_are_accepted() -> None:
    a = BlockAllocator(8, 4)
    ids = a.allocate(np.int64(3))
    a.fork(np.array(ids, dtype=np.int64))
    assert [a.ref_count(np.int32(i)) for i in ids] == [2, 2, 2]
    a.free(np.array(ids, dtype=np.int32))
    a.free(tuple(ids))
    assert a.num_free_blocks == 8
    with pytest.raises(TypeError):
        a.free([1.5])


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda a, ids: a.free([ids[0], ids[0]]), "ids: block .* listed more times"),
        (lambda a, ids: a.free([ids[1], 99]), r"ids: block id 99 at index 1 is out of range"),
        (lambda a, ids: a.free([-1]), "ids: block id -1"),
        (lambda a, ids: a.free([2**40]), "ids: block id"),
        (lambda a, ids: a.fork([7]), "ids: block 7 is not allocated"),
        (lambda a, ids: a.ref_count(8), "id: block id 8"),
        (lambda a, ids: a.copy_on_write(5), "id: block 5 is not allocated"),
        (lambda a, ids: a.allocate(-2), "n must be >= 0"),
        (lambda a, ids: a.match_prefix([1, 2], max_blocks=-1), "max_blocks must be >= 0"),
        (lambda a, ids: a.cache_full_block(ids[0], None, [1, 2, 3]), "tokens must hold"),
        (lambda a, ids: a.cache_full_block(6, None, [1, 2, 3, 4]), "id: block 6 is not alloc"),
        (lambda a, ids: a.swap_out(ids), "ids: not enough free blocks"),
        (lambda a, ids: a.swap_in([0]), r"cpu_ids: block id 0 at index 0 is out of range"),
    ],
)
def test_bad_calls_raise_value_error_naming_argument_and_change_nothing(call, match) -> None:
    a = BlockAllocator(8, 4)
    ids = a.allocate(2)
    before = (a.stats(), [a.ref_count(i) for i in range(8)])
    with pytest.raises((ValueError, MemoryError), match=match):
        call(a, ids)
    assert (a.stats(), [a.ref_count(i) for i in range(8)]) == before
    assert a.check_invariants() == ""


def test_double_free_is_value_error() -> None:
    a = BlockAllocator(4, 4)
    ids = a.allocate(2)
    a.free(ids)
    with pytest.raises(ValueError, match="double free"):
        a.free(ids[:1])


def test_constructor_validates() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        BlockAllocator(-1, 16)
    with pytest.raises(ValueError, match="block_size"):
        BlockAllocator(4, 0)
    with pytest.raises(ValueError, match="num_cpu_blocks"):
        BlockAllocator(4, 16, num_cpu_blocks=-3)


def test_fork_and_copy_on_write() -> None:
    a = BlockAllocator(4, 4, enable_prefix_caching=False)
    (b,) = a.allocate(1)
    a.fork([b, b])
    assert a.ref_count(b) == 3
    new, copied = a.copy_on_write(b)
    assert copied and new != b
    assert a.ref_count(b) == 2 and a.ref_count(new) == 1
    same, copied = a.copy_on_write(new)
    assert (same, copied) == (new, False)
    copies = a.take_pending_copies()
    assert copies.dtype == np.int64 and copies.shape == (1, 2)
    assert copies.tolist() == [[b, new]]
    assert a.take_pending_copies().shape == (0, 2)
    a.free([b, b, new])
    assert a.num_free_blocks == 4


def test_copy_on_write_of_cached_block_keeps_the_cached_content() -> None:
    a = BlockAllocator(4, 2)
    (b,) = cache_chain(a, [5, 6])
    new, copied = a.copy_on_write(b)
    assert copied and a.ref_count(b) == 1  # kept until the copy is taken: cannot be reused
    assert a.allocate(2) and a.num_free_blocks == 0
    assert a.take_pending_copies().tolist() == [[b, new]]
    assert a.ref_count(b) == 0 and a.num_cached_free_blocks == 1
    assert a.match_prefix([5, 6, 7]) == [b]


def test_swap_out_and_in_produce_mappings() -> None:
    a = BlockAllocator(6, 4, num_cpu_blocks=4)
    ids = a.allocate(3)
    cpu, out_map = a.swap_out(ids)
    assert out_map.dtype == np.int64 and out_map.tolist() == [[d, h] for d, h in zip(ids, cpu)]
    assert a.num_free_blocks == 6 and a.num_free_cpu_blocks == 1
    assert all(a.cpu_ref_count(h) == 1 for h in cpu)
    with pytest.raises(MemoryError):
        a.swap_out(a.allocate(2))
    back, in_map = a.swap_in(cpu)
    assert in_map.tolist() == [[h, d] for h, d in zip(cpu, back)]
    assert a.num_free_cpu_blocks == 4
    with pytest.raises(ValueError, match="cpu_ids: block .* not allocated"):
        a.swap_in(cpu[:1])
    cpu2, _ = a.swap_out(back[:1])
    a.free_cpu(cpu2)
    assert a.num_free_cpu_blocks == 4
    assert a.stats()["swapped_out_blocks"] == 4 and a.stats()["swapped_in_blocks"] == 3


def test_hash_block_is_chained_and_keyed() -> None:
    h = hash_block(None, [1, 2, 3])
    assert isinstance(h, tuple) and len(h) == 2
    assert h == hash_block(ROOT_BLOCK_HASH, np.array([1, 2, 3], dtype=np.int32))
    assert h != hash_block(None, [1, 2, 3], extra_key=1)
    assert h != hash_block(h, [1, 2, 3])
    assert h != hash_block(None, [1, 3, 2])
    assert BlockAllocator.hash_block(None, [1, 2, 3]) == h
    assert BlockAllocator(1, 3).hash_block(None, [1, 2, 3]) == h
    assert BlockAllocator.ROOT_HASH == ROOT_BLOCK_HASH == (0, 0)


def test_prefix_cache_reuses_longest_prefix_and_counts() -> None:
    a = BlockAllocator(32, 4)
    rng = random.Random(1)
    prompt = [rng.randrange(50000) for _ in range(18)]
    ids = cache_chain(a, prompt)  # 4 full blocks
    a.free(ids)
    assert a.num_cached_blocks == 4 and a.num_cached_free_blocks == 4
    query = prompt[:13] + [1, 2, 3]
    assert a.peek_prefix(query) == 3
    got = a.match_prefix(np.array(query, dtype=np.int32))
    assert got == ids[:3]
    assert [a.ref_count(i) for i in ids] == [1, 1, 1, 0]
    s = a.stats()
    assert (s["prefix_queries"], s["prefix_queries_tokens"], s["prefix_hits_tokens"]) == (1, 16, 12)
    assert a.match_prefix(query, max_blocks=1) == ids[:1]
    assert a.match_prefix(query, extra_key=3) == []  # another adapter / salt
    assert a.block_hash(ids[0]) == hash_block(None, prompt[:4])
    a.reset_prefix_cache()
    assert a.match_prefix(query) == [] and a.num_cached_blocks == 0
    assert a.block_hash(ids[0]) is None


def test_seed_002_block_size_1_reuses_7_tokens_and_prefills_5() -> None:
    a = BlockAllocator(64, 1)
    first = [791, 6460, 315, 9822, 374, 12366, 13]  # 7-token prompt
    ids = cache_chain(a, first)
    a.free(ids)
    second = first + [578, 6864, 315, 15704, 374]  # 12 tokens sharing the 7
    got = a.match_prefix(second, max_blocks=len(second) - 1)
    assert got == ids and len(got) == 7
    assert len(second) - len(got) == 5  # tokens to prefill (positions 7..11)
    assert a.stats()["prefix_hits_tokens"] == 7


def test_eviction_is_lazy_lru_tail_first() -> None:
    a = BlockAllocator(6, 2)
    p = list(range(12))
    ids = cache_chain(a, p)
    a.free(ids)
    assert a.num_free_blocks == 6
    taken = a.allocate(2)
    assert taken == [ids[5], ids[4]]  # the chain's tail is evicted first
    assert a.stats()["evictions"] == 2
    assert a.match_prefix(p) == ids[:4]


def test_partial_block_reuse_copies_the_matching_block() -> None:
    a = BlockAllocator(8, 4)
    p = [1, 2, 3, 4, 5, 6, 7, 8]
    ids = cache_chain(a, p)
    a.free(ids)
    got, n = a.match_prefix_partial([1, 2, 3, 4, 5, 6, 7, 0, 0])
    assert n == 7 and got[0] == ids[0] and got[1] not in ids
    assert a.take_pending_copies().tolist() == [[ids[1], got[1]]]
    assert a.stats()["partial_hit_tokens"] == 3
    a.free(got)
    got, n = a.match_prefix_partial([1, 2, 3, 4, 5, 6, 7, 8], max_tokens=7)
    assert n == 7  # capped: the last prompt token is recomputed
    assert a.check_invariants() == ""
