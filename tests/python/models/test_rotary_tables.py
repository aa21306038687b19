"""A rotary table a CUDA graph may have captured is never freed: engines that share one model
(LLM's weak model table) each reserve tables, and a graph of the first engine must keep reading
the memory it was captured with (on the H200 a second engine's reserve swapped the table under
the first engine's graphs: its greedy tokens changed)."""

from __future__ import annotations

import torch
from pagedkv.models.rotary import RotaryEmbedding


def test_reserve_keeps_the_table_when_it_covers_the_length() -> None:
    rope = RotaryEmbedding(64, 128, 10000.0)
    rope.reserve(128, torch.float32, torch.device("cpu"))
    cache, table = rope._cache, rope._table
    rope.reserve(64, torch.float32, torch.device("cpu"))  # a second engine, shorter context
    assert rope._cache is cache and rope._table is table


def test_a_grown_table_keeps_the_old_one_alive_and_unchanged() -> None:
    rope = RotaryEmbedding(64, 128, 10000.0)
    rope.reserve(128, torch.float32, torch.device("cpu"))
    old_cache, old_table = rope._cache, rope._table
    assert old_cache is not None and old_table is not None
    before = old_cache.clone()
    rope.reserve(512, torch.float32, torch.device("cpu"))  # a second engine, longer context
    assert rope._cache is not old_cache and rope._cache.shape[0] >= 512
    assert any(t is old_cache for t in rope._retired)
    assert any(t is old_table for t in rope._retired)
    assert torch.equal(old_cache, before)
    assert torch.equal(rope._cache[: before.shape[0]], before)  # same rows, longer
