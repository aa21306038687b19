"""Checks shared by the engine tests."""

from __future__ import annotations

from typing import Any


def assert_no_leak(llm: Any) -> None:
    """After generate: no request left and every KV block back in the free pool."""
    eng = llm.llm_engine
    assert not eng.has_unfinished_requests()
    assert eng.scheduler.num_free_blocks == eng.num_gpu_blocks, "KV blocks leaked"
    assert eng.scheduler.kv_cache_usage == 0.0
