"""Shared pytest fixtures and skips."""

from __future__ import annotations

import pagedkv
import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if pagedkv.cuda_available():
        return
    reason = ("no usable CUDA GPU on this machine (pagedkv built "
              f"{'with' if pagedkv.build_info()['with_cuda'] else 'without'} CUDA): "
              "CUDA tests skipped")
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
