"""Optional test dependencies. Where one is missing its tests skip, except under CI (CI=true):
the test command installs every one of them there, so a missing one is a broken install step
and must fail, not hide behind a skip."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def need(module: str) -> ModuleType:
    """`module`, imported; a skip where it is missing (an ImportError under CI)."""
    if under_ci():
        return importlib.import_module(module)
    return pytest.importorskip(module)
