"""How the ranks of a parallel engine tear their process groups down. NCCL's communicator
finalize / destroy / abort are intra-node collectives, which gloo (CI) does not show: here a
fake worker process emulates one (its teardown waits for the driver's)."""

from __future__ import annotations

import multiprocessing
import os
import queue
from typing import Any

import pytest
from support.deps import need

need("torch")

from pagedkv.engine import executor_mp  # noqa: E402
from pagedkv.engine.worker import SHUTDOWN  # noqa: E402


class _QueueChannel:
    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def send(self, name: str, args: Any) -> None:
        self.queue.put((name, args))

    def close(self) -> None:
        pass


class _GraphsWorker:
    """A rank's Worker as teardown sees it. NCCL's destroy and abort wait until every CUDA
    graph that captured a collective is gone: a rank that still held its graphs hung there
    (2 H200s), so the graphs must go first."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def release_cuda_graphs(self) -> None:
        self.calls.append("release graphs")


def _collective_teardown_worker(commands: Any, driver_destroyed: Any) -> None:
    """A worker whose group teardown, like NCCL's, ends only once the driver's has begun."""
    name, _ = commands.get(timeout=60)
    assert name == SHUTDOWN
    try:
        driver_destroyed.get(timeout=60)
    except queue.Empty:
        os._exit(3)
    os._exit(0)


def test_driver_destroys_its_groups_with_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver that waited for the workers to exit before destroying its own groups deadlocked
    on two H200s (the workers waited in their destroy, the driver killed them, then waited in
    its own for ever)."""
    ctx = multiprocessing.get_context("spawn")
    commands, destroyed = ctx.Queue(), ctx.Queue()
    state = executor_mp._Procs()
    state.channel = _QueueChannel(commands)
    proc = ctx.Process(target=_collective_teardown_worker, args=(commands, destroyed))
    proc.start()
    state.procs.append(proc)
    calls: list[str] = []
    state.worker = _GraphsWorker(calls)

    def destroy() -> None:
        calls.append("destroy")
        destroyed.put(True)

    monkeypatch.setattr(executor_mp, "destroy_model_parallel", destroy)
    monkeypatch.setattr(executor_mp, "abort_model_parallel", lambda: calls.append("abort"))
    monkeypatch.setattr(executor_mp, "_JOIN_TIMEOUT_S", 20.0)
    try:
        executor_mp._tear_down(state)
    finally:
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0, "the worker was killed waiting for the driver's teardown"
    assert calls == ["release graphs", "destroy"]


def test_a_worker_that_exited_first_makes_the_driver_abort(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nobody would join a collective destroy for a worker that is gone: the driver aborts."""
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=os._exit, args=(0,))
    proc.start()
    proc.join(30)
    state = executor_mp._Procs()
    state.channel = _QueueChannel(ctx.Queue())
    state.procs.append(proc)
    calls: list[str] = []
    state.worker = _GraphsWorker(calls)
    monkeypatch.setattr(executor_mp, "destroy_model_parallel", lambda: calls.append("destroy"))
    monkeypatch.setattr(executor_mp, "abort_model_parallel", lambda: calls.append("abort"))
    executor_mp._tear_down(state)
    assert calls == ["release graphs", "abort"] and state.dead is not None


@pytest.mark.parametrize("asked_to_stop,want", [(True, "destroy"), (False, "abort")])
def test_a_worker_destroys_only_when_asked_to_stop(
    monkeypatch: pytest.MonkeyPatch, asked_to_stop: bool, want: str
) -> None:
    """On SHUTDOWN every rank destroys together; a worker whose driver is gone (or whose
    command failed) aborts, which waits for no one."""
    calls: list[str] = []
    monkeypatch.setattr(executor_mp, "Worker", lambda cfg, device: _GraphsWorker(calls))
    monkeypatch.setattr(executor_mp, "worker_loop", lambda worker, channel: asked_to_stop)
    monkeypatch.setattr(executor_mp, "destroy_model_parallel", lambda: calls.append("destroy"))
    monkeypatch.setattr(executor_mp, "abort_model_parallel", lambda: calls.append("abort"))
    with pytest.raises(SystemExit):
        executor_mp._serve_as_worker(None, None, _QueueChannel(None))  # type: ignore[arg-type]
    assert calls == ["release graphs", want]
