"""How ModelRunner sizes the KV cache: kv_cache_space (GiB) on the CPU, the GPU memory profile
(gpu_memory_utilization) on a GPU, where an explicit kv_cache_space is ignored with a warning.

No model and no GPU: the runner is built on a stand-in model config and, for the GPU case, a
`cuda` device whose memory profile is replaced (only the sizing decision runs)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Optional

import pytest
from support.deps import need

torch = need("torch")

from pagedkv.engine.config import EngineConfig  # noqa: E402
from pagedkv.engine.model_runner import ModelRunner  # noqa: E402

_GiB = 1 << 30


def _runner(device: str, kv_cache_space: Optional[float]) -> ModelRunner:
    cfg = EngineConfig.from_kwargs(None, device=device, kv_cache_space=kv_cache_space)
    mc = SimpleNamespace(
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64
    )
    return ModelRunner(
        cfg,
        torch.nn.Identity(),
        mc,
        torch.device(device),
        torch.float32,
        max_model_len=256,
        max_num_batched_tokens=256,
    )


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def pagedkv_log():  # type: ignore[no-untyped-def]
    """The "pagedkv" logger's records, from a handler on that logger itself: pytest's caplog
    listens on the root logger, which an LLM made earlier in the session cuts pagedkv's records
    off from (its own handler, propagate=False; fresh-clone CI failed on that)."""
    log = logging.getLogger("pagedkv")
    handler, level = _Records(), log.level
    log.setLevel(logging.INFO)  # setLevel, not the attribute: it clears the level caches
    log.addHandler(handler)
    yield handler
    log.removeHandler(handler)
    log.setLevel(level)


def _warnings(log: _Records) -> list:
    return [r.getMessage() for r in log.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("space", [None, 0.5])
def test_cpu_cache_is_sized_by_kv_cache_space(space, pagedkv_log):
    runner = _runner("cpu", space)
    num_blocks, num_cpu = runner.determine_num_blocks()
    assert num_blocks == int((space or 4.0) * _GiB) // runner.block_bytes() and num_cpu == 0
    assert _warnings(pagedkv_log) == []


@pytest.mark.parametrize("space", [None, 0.5])
def test_gpu_ignores_kv_cache_space_and_says_so(space, pagedkv_log, monkeypatch):
    runner = _runner("cuda", space)
    monkeypatch.setattr(runner, "_profile_gpu_blocks", lambda per_block: 123)
    assert runner.determine_num_blocks() == (123, 0)
    warned = _warnings(pagedkv_log)
    if space is None:
        assert warned == []
        return
    assert len(warned) == 1, warned
    assert "--kv-cache-space" in warned[0] and "CPU" in warned[0]
    assert "--gpu-memory-utilization" in warned[0] and "0.9" in warned[0]
