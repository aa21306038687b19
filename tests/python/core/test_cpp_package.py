"""The installed C++ package is found by a separate CMake project (examples/cpp), which builds
and runs against it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pagedkv
import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")
def test_example_app_builds_against_installed_package(tmp_path: Path) -> None:
    cmake_dir = Path(pagedkv.cmake_dir())
    assert (cmake_dir / "pagedkvConfig.cmake").is_file(), "wheel installs the CMake package"
    build = tmp_path / "build"
    env = dict(os.environ)
    subprocess.run(
        [
            "cmake",
            "-S",
            str(ROOT / "examples" / "cpp"),
            "-B",
            str(build),
            f"-Dpagedkv_DIR={cmake_dir}",
            "-DCMAKE_BUILD_TYPE=Release",
        ],
        check=True,
        env=env,
        capture_output=True,
    )
    subprocess.run(["cmake", "--build", str(build), "-j", "2"], check=True, capture_output=True)
    exe = build / "pagedkv_example"
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    assert f"pagedkv {pagedkv.__version__}" in out
    # Seed 000's trace, scheduled by the installed library (whole lines: only the plan's
    # num_seqs entries are printed, not the arrays' unused tail).
    lines = out.splitlines()
    assert "step 1: 2 prefills, 512 prefill tokens, 0 decode tokens, seq_lens 484 28" in lines
    assert "step 2: 1 prefills, 456 prefill tokens, 1 decode tokens, seq_lens 484 485" in lines
    assert "step 3: 0 prefills, 0 prefill tokens, 2 decode tokens, seq_lens 486 485" in lines
    assert "decode attention over 5 cached tokens" in out
