"""Shared pytest fixtures and skips."""

from __future__ import annotations

import faulthandler
from typing import Iterator

import pagedkv
import pytest
from support.deps import need_default_model


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--serial-loop",
        action="store_true",
        help="engines left at async_scheduling=None (auto: overlapped where supported) run the "
        "serial step loop instead, in this process: the engine tests run both ways show the "
        "overlapped loop's outputs are the serial loop's",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--serial-loop"):
        from pagedkv.engine.config import EngineConfig

        # Only the default changes: an explicit async_scheduling=True still overlaps.
        EngineConfig.overlapped_steps = property(  # type: ignore[method-assign,assignment]
            lambda self: bool(self.async_scheduling)
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if pagedkv.cuda_available():
        return
    reason = (
        "no usable CUDA GPU on this machine (pagedkv built "
        f"{'with' if pagedkv.build_info()['with_cuda'] else 'without'} CUDA): "
        "CUDA tests skipped"
    )
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Puts pytest's faulthandler back before each test: loading xgrammar (its tvm-ffi library)
    replaces the SIGSEGV handler with one that prints only C frames, to a stderr that pytest is
    capturing, so a crash would leave no trace of the Python code that caused it."""
    from _pytest.faulthandler import fault_handler_stderr_fd_key

    fd = item.config.stash.get(fault_handler_stderr_fd_key, None)
    if fd is not None:
        faulthandler.disable()  # (enable() alone keeps the handler it believes is installed)
        faulthandler.enable(file=fd, all_threads=True)


@pytest.fixture(scope="session")
def smollm2_gguf() -> str:
    """Path of the embedded default model's GGUF file (support.deps.need_default_model)."""
    return need_default_model()


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """torch on one thread during the test (opt in: ``pytestmark =
    pytest.mark.usefixtures("one_torch_thread")``): tiny matmuls on a shared 2-core machine run
    ~10x slower through torch's thread pool, and engine workers of their own processes would
    only contend."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
