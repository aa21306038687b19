#!/usr/bin/env bash
# Every CUDA-marked test of this tree on the installed build (pytest -n 8 -m cuda), logs under $OUT.
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -c "import pytest, xdist" 2>/dev/null && par="-n 8" || par=""
timeout ${T:-420} python3 -m pytest -q $par -p no:cacheprovider -m cuda tests/python -rfEs --tb=short \
  > "$OUT/cuda_tests.log" 2>&1
grep -v "PytestBenchmarkWarning\|warner(\|CUDAGraph.cpp" "$OUT/cuda_tests.log" | grep -E "FAILED|ERROR|passed|failed" | tail -40
grep -B5 -A25 "^___" "$OUT/cuda_tests.log" | head -150
