"""The package imports with numpy alone and describes its build."""

from __future__ import annotations

import re
import subprocess
import sys

import pagedkv


def test_version_is_semver() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", pagedkv.__version__)
    assert pagedkv.build_info()["version"] == pagedkv.__version__


def test_build_info_fields() -> None:
    info = pagedkv.build_info()
    assert set(info) >= {"version", "with_cuda", "cuda_archs", "compiler", "build_type"}
    assert isinstance(info["with_cuda"], bool)
    if info["with_cuda"]:
        assert info["cuda_archs"], "a CUDA build lists its architectures"
    else:
        assert info["cuda_archs"] == []
        assert pagedkv.cuda_available() is False


def test_cuda_available_is_bool_and_consistent() -> None:
    assert isinstance(pagedkv.cuda_available(), bool)
    assert pagedkv.cuda_available() == (pagedkv.cuda_device_count() > 0)


def test_import_does_not_pull_torch() -> None:
    code = "import sys, pagedkv; pagedkv.build_info(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_unknown_attribute_raises() -> None:
    try:
        pagedkv.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("expected AttributeError")
