"""benchmarks/gpu_engine_table.py's GPU-busy measure (DeviceSpans), on a fake device clock:
CUDA events stand-ins that read a clock the fake engine core advances as its "device" runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, List

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]


def _table() -> Any:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(
            "gpu_engine_table", ROOT / "benchmarks" / "gpu_engine_table.py"
        )
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["gpu_engine_table"] = mod
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


class _Stream:
    """One in-order device stream: work queued at host time t starts at max(t, free)."""

    def __init__(self) -> None:
        self.host = 0.0  # the host's clock (ms)
        self.free = 0.0  # when the stream has run everything queued so far

    def launch(self, ms: float) -> None:
        self.free = max(self.free, self.host) + ms


class _Event:
    stream: _Stream

    def __init__(self, enable_timing: bool = False) -> None:
        self.t = -1.0

    def record(self) -> None:  # completes once the stream reaches it (idle: now)
        self.t = max(self.stream.free, self.stream.host)

    def elapsed_time(self, other: _Event) -> float:
        return other.t - self.t


def _core(stream: _Stream, forward_ms: float, sample_ms: float) -> Any:
    def execute(plan: Any, *_: Any) -> None:
        stream.launch(forward_ms)
        stream.host += 0.01

    def sample(plan: Any, *_: Any) -> None:
        stream.launch(sample_ms)
        stream.host += 0.01

    return SimpleNamespace(_execute=execute, _sample=sample)


@pytest.mark.parametrize("host_gap_ms, expect", [(0.2, 1.0), (3.0, 1.5 / 3.02)])
def test_busy_share_of_the_decode_steps(monkeypatch, host_gap_ms: float, expect: float):
    table = _table()
    stream = _Stream()
    _Event.stream = stream
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    core = _core(stream, forward_ms=1.0, sample_ms=0.5)
    spans = table.DeviceSpans()
    plain = (core._execute, core._sample)
    restore = spans.install(core)
    prefill, decode = SimpleNamespace(num_prefills=1), SimpleNamespace(num_prefills=0)
    plans: List[Any] = [prefill] + [decode] * 20
    for plan in plans:
        core._execute(plan)
        stream.host += host_gap_ms  # the host's work between the launches (apply, outputs)
        core._sample(plan)
    restore()
    assert (core._execute, core._sample) == plain
    out = spans.busy_decode()
    assert out["decode_spans"] == 40
    # A host slower than the device leaves it idle from each step's end to the next launch.
    assert out["gpu_busy_decode"] == pytest.approx(expect, rel=0.02)
    assert 0 < out["gpu_busy_decode"] <= 1


def test_no_decode_step_or_inconsistent_spans_raise():
    table = _table()
    with pytest.raises(RuntimeError, match="0 decode spans"):
        table.busy_fraction([], [])
    with pytest.raises(RuntimeError, match="do not fit"):
        table.busy_fraction([2.0, 1.0], [1.0, 1.0])
    assert table.busy_fraction([1.0, 1.0], [2.0, 2.0])["gpu_busy_decode"] == 0.5
