"""The vocabularies the kernels share (kv_cache_dtype names, head sizes, the partition size, kernel
names) are defined once in include/pagedkv/ops.h and every layer reads that list; kernels are
chosen by argument, and the C++ code reads no environment variable."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pagedkv import _C, ops
from pagedkv.attention import PagedAttention

ROOT = Path(__file__).resolve().parents[3]


def _decode_args(head_size: int = 64, dtype: type = np.float32) -> tuple:
    """A valid single-sequence decode over an NHD cache (the kernel choice reads shapes only)."""
    q = np.zeros((1, 4, head_size), dtype)
    cache = np.zeros((2, 16, 2, head_size), dtype)
    return q, cache, cache, 2


def test_lists_come_from_the_kernels() -> None:
    from pagedkv.engine import paged_backend
    from pagedkv.engine.config import KV_CACHE_DTYPES
    from pagedkv.entrypoints.engine_args import KV_CACHE_DTYPE_CHOICES

    assert ops.KV_CACHE_DTYPES == ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
    assert KV_CACHE_DTYPES is _C.KV_CACHE_DTYPES and KV_CACHE_DTYPE_CHOICES is _C.KV_CACHE_DTYPES
    assert paged_backend._PARTITION_SIZE == ops.PARTITION_SIZE == 512
    assert PagedAttention.get_supported_head_sizes() == list(ops.SUPPORTED_HEAD_SIZES)
    assert ops.ATTENTION_KERNELS[0] == "auto"


def test_errors_quote_the_lists() -> None:
    """A bad name or size is refused with the list it is checked against."""
    q, kc, vc, hkv = _decode_args()
    with pytest.raises(ValueError) as e:
        ops.decode_kernel(q, kc, vc, hkv, "int4")
    assert all(repr(n) in str(e.value) for n in ops.KV_CACHE_DTYPES), e.value
    with pytest.raises(ValueError) as e:
        ops.decode_kernel(q, kc, vc, hkv, kernel="bulk")
    assert all(repr(n) in str(e.value) for n in ops.ATTENTION_KERNELS), e.value
    bad = next(h for h in range(16, 512, 8) if h not in ops.SUPPORTED_HEAD_SIZES)
    with pytest.raises(ValueError) as e:
        ops.decode_kernel(*_decode_args(bad))
    assert ", ".join(map(str, ops.SUPPORTED_HEAD_SIZES)) in str(e.value), e.value


@pytest.mark.parametrize("head_size", ops.SUPPORTED_HEAD_SIZES)
def test_every_listed_head_size_is_served(head_size: int) -> None:
    assert ops.decode_kernel(*_decode_args(head_size)) == "cpu"


@pytest.mark.parametrize("kernel", ops.ATTENTION_KERNELS)
def test_kernel_argument_on_host_arrays(kernel: str) -> None:
    """Host arrays have one kernel: "auto" and "cpu" run it, a GPU kernel is refused by name
    (never accepted and ignored), by the ops as by the kernel query."""
    q, kc, vc, hkv = _decode_args()
    out = np.full_like(q, np.nan)
    table, lens = np.array([[0, 1]], np.int32), np.array([20], np.int32)

    def decode() -> None:
        ops.paged_attention_v1(out, q, kc, vc, hkv, 0.125, table, lens, 16, 20, kernel=kernel)

    if kernel in ("auto", "cpu"):
        assert ops.decode_kernel(q, kc, vc, hkv, kernel=kernel) == "cpu"
        decode()
        assert np.isfinite(out).all()
        return
    with pytest.raises(ValueError, match=f"kernel '{kernel}' runs on CUDA arrays"):
        ops.decode_kernel(q, kc, vc, hkv, kernel=kernel)
    with pytest.raises(ValueError, match=f"kernel '{kernel}' runs on CUDA arrays"):
        decode()
    with pytest.raises(ValueError, match=f"kernel '{kernel}' runs on CUDA arrays"):
        PagedAttention.forward_prefix(
            q,
            q[:, :2],
            q[:, :2],
            "auto",
            kc,
            vc,
            table,
            np.array([0, 1], np.int32),
            lens,
            1,
            None,
            None,
            1.0,
            1.0,
            kernel=kernel,
        )


def test_no_environment_switches_in_the_library() -> None:
    """Kernel choices are arguments or compile-time variants: no getenv in src/ or include/."""
    hits = [
        f"{p.relative_to(ROOT)}:{i + 1}"
        for folder in ("src", "include")
        for p in sorted((ROOT / folder).rglob("*"))
        if p.is_file() and p.suffix in {".h", ".cuh", ".cpp", ".cu", ".cc"}
        for i, line in enumerate(p.read_text(errors="replace").splitlines())
        if re.search(r"\bgetenv\s*\(", line)
    ]
    assert not hits, hits


def test_num_threads_from_environment() -> None:
    """PAGEDKV_NUM_THREADS is read once, by the package at import (not by the C++ library); a
    value that is not a positive integer is refused by name."""
    code = "import pagedkv; print(pagedkv._C.ops_num_threads())"
    env = {**os.environ, "PAGEDKV_NUM_THREADS": "3"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "3", out.stderr
    env["PAGEDKV_NUM_THREADS"] = "two"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "PAGEDKV_NUM_THREADS must be a positive integer" in out.stderr
