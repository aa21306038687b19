"""Prompts and checks shared by the engine tests."""

from __future__ import annotations

from typing import Any

# Prompts for the embedded SmolLM2 (code, prose, list, instruction, explanation).
SMOLLM2_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived",
    "List three primary colors:",
    "Write a short poem about the ocean.",
    "Explain what a CPU cache is:",
]


def cpu_llm(kv_cache_space: float, max_model_len: int, /, **kw: Any) -> Any:
    """The default model on the CPU with a small KV cache (the engine test modules' LLM); the
    two sizes are defaults that `kw` may override."""
    from pagedkv import LLM

    return LLM(
        device="cpu", **{"kv_cache_space": kv_cache_space, "max_model_len": max_model_len, **kw}
    )


def assert_no_leak(llm: Any) -> None:
    """After generate: no request left and every KV block back in the free pool."""
    eng = llm.llm_engine
    assert not eng.has_unfinished_requests()
    assert eng.scheduler.num_free_blocks == eng.num_gpu_blocks, "KV blocks leaked"
    assert eng.scheduler.kv_cache_usage == 0.0
