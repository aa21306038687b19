"""request_failures.try_batch, the one rule for a batched part of a step that raises: an error
of the step's requests gives FAILED (the caller redoes the work request by request), a device
error passes. And the structured-output bitmask's retry built on it: a matcher that raises
fails its request alone, the batch is taken again without that row."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, List, Optional

import pytest
import torch
from support.deps import need

need("torch")

from pagedkv.engine.request_failures import FAILED, EngineDownError, try_batch  # noqa: E402
from pagedkv.engine.step_sampling import StepSampling  # noqa: E402


def _raise(exc: BaseException) -> Any:
    raise exc


def test_try_batch() -> None:
    assert try_batch(lambda: [1, 2]) == [1, 2]
    assert try_batch(lambda: None) is None  # (a batch may answer None: that is no failure)
    assert try_batch(lambda: _raise(ValueError("a request's bad value"))) is FAILED
    with pytest.raises(RuntimeError, match="CUDA error"):
        try_batch(lambda: _raise(RuntimeError("CUDA error: an illegal memory access")))
    with pytest.raises(KeyboardInterrupt):
        try_batch(lambda: _raise(KeyboardInterrupt()))
    # A parallel engine that is down is nobody's fault either (not one failure per request).
    with pytest.raises(EngineDownError):
        try_batch(lambda: _raise(EngineDownError("the parallel engine is down: rank 1 exited")))


class _Bitmask:
    """take() raises while a row's matcher is "bad"; fill_bitmask raises for that matcher."""

    def __init__(self) -> None:
        self.taken: List[List[Optional[Any]]] = []
        self.grammars = SimpleNamespace(fill_bitmask=self._fill)

    @staticmethod
    def _fill(matchers: List[Any]) -> None:
        if any(m == "bad" for m in matchers):
            raise ValueError("matcher bug")

    def take(self, seqs: List[Optional[Any]], device: torch.device) -> Optional[torch.Tensor]:
        self.taken.append(list(seqs))
        if any(s is not None and s.matcher == "bad" for s in seqs):
            raise ValueError("matcher bug")
        return torch.ones(len(seqs), 1, dtype=torch.int32)


def test_a_raising_matcher_fails_its_request_alone() -> None:
    work = StepSampling(None, None, None, None, 3, None, [])  # type: ignore[arg-type]
    reqs = [SimpleNamespace(request_id=f"r{i}") for i in range(3)]
    work._row_reqs = reqs  # type: ignore[assignment]
    seqs = [SimpleNamespace(matcher=m) for m in ("ok", "bad", None)]
    bitmask = _Bitmask()
    got = work._take_bitmask(bitmask, seqs, torch.device("cpu"))  # type: ignore[arg-type]
    assert got is not None and got.shape == (3, 1)
    assert [r.request_id for r, _ in work.failures.items()] == ["r1"]
    assert bitmask.taken[-1] == [seqs[0], None, seqs[2]]  # taken again without the bad row
    assert work._take_bitmask(_Bitmask(), [seqs[0]], torch.device("cpu")) is not None


def test_an_unconstrained_batch_is_taken_once() -> None:
    # take() answers None when no row is constrained: that is its answer, not a failure.
    work = StepSampling(None, None, None, None, 1, None, [])  # type: ignore[arg-type]
    calls: List[int] = []
    bitmask = SimpleNamespace(take=lambda seqs, device: calls.append(1))
    seqs = [SimpleNamespace(matcher=None)]
    assert work._take_bitmask(bitmask, seqs, torch.device("cpu")) is None  # type: ignore[arg-type]
    assert calls == [1] and not work.failures
