"""How ModelRunner sizes the KV cache: kv_cache_space (GiB) on the CPU, the GPU memory profile
(gpu_memory_utilization) on a GPU, where an explicit kv_cache_space is ignored with a warning.

No model and no GPU: the runner is built on a stand-in model config and, for the GPU case, a
`cuda` device whose memory profile is replaced (only the sizing decision runs)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Optional

import pytest
from deps import need

torch = need("torch")

from pagedkv.engine.config import EngineConfig  # noqa: E402
from pagedkv.engine.model_runner import ModelRunner  # noqa: E402

_GiB = 1 << 30


def _runner(device: str, kv_cache_space: Optional[float]) -> ModelRunner:
    cfg = EngineConfig.from_kwargs(None, device=device, kv_cache_space=kv_cache_space)
    mc = SimpleNamespace(num_hidden_layers=2, num_key_value_heads=2, head_dim=64)
    return ModelRunner(cfg, torch.nn.Identity(), mc, torch.device(device), torch.float32,
                       max_model_len=256, max_num_batched_tokens=256)


@pytest.fixture(autouse=True)
def _pagedkv_records_reach_caplog(monkeypatch: pytest.MonkeyPatch) -> None:
    """An LLM made by an earlier test in the session sets up the "pagedkv" logger with its own
    handler and propagate=False (pagedkv.engine.llm), which keeps its records from caplog's
    root handler; this file runs in any order."""
    monkeypatch.setattr(logging.getLogger("pagedkv"), "propagate", True)


def _warnings(caplog: pytest.LogCaptureFixture) -> list:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("space", [None, 0.5])
def test_cpu_cache_is_sized_by_kv_cache_space(space, caplog):
    runner = _runner("cpu", space)
    with caplog.at_level(logging.INFO, logger="pagedkv"):
        num_blocks, num_cpu = runner.determine_num_blocks()
    assert num_blocks == int((space or 4.0) * _GiB) // runner.block_bytes() and num_cpu == 0
    assert _warnings(caplog) == []


@pytest.mark.parametrize("space", [None, 0.5])
def test_gpu_ignores_kv_cache_space_and_says_so(space, caplog, monkeypatch):
    runner = _runner("cuda", space)
    monkeypatch.setattr(runner, "_profile_gpu_blocks", lambda per_block: 123)
    with caplog.at_level(logging.INFO, logger="pagedkv"):
        assert runner.determine_num_blocks() == (123, 0)
    warned = _warnings(caplog)
    if space is None:
        assert warned == []
        return
    assert len(warned) == 1, warned
    assert "--kv-cache-space" in warned[0] and "CPU" in warned[0]
    assert "--gpu-memory-utilization" in warned[0] and "0.9" in warned[0]
