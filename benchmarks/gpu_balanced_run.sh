#!/usr/bin/env bash
# The work-balanced decode's GPU run (issue #32), about 3 minutes on an installed CUDA build:
# its CUDA tests (balanced random cases vs float64, a CUDA graph replaying a refilled plan,
# refusals) with the Hopper decode's and the split-K ops' tests (the kernel and the reduction
# changed), then gpu_attention.py's skewed-batch table (ours = the library's choice, the previous
# split-K, the balanced plan at one and two waves, FA2 varlen) and its uniform decode table.
# Logs go to $OUT (default ./gpu_out).
#   SKIP_BUILD=1 bash benchmarks/gpu_balanced_run.sh
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
start=$SECONDS
timeout 100 python3 -m pytest -q -n 8 -p no:cacheprovider -m cuda -rfEs --tb=short \
  tests/python/kernels/test_decode_balanced_cuda.py tests/python/kernels/test_decode_bulk_cuda.py \
  tests/python/kernels/test_ops_cuda.py tests/python/kernels/test_cuda_graph.py \
  tests/python/engine/test_balanced_decode_engine_cuda.py tests/python/engine/test_engine_cuda.py \
  > "$OUT/balanced_tests.log" 2>&1
echo "pytest exit $? after $((SECONDS - start)) s" | tee -a "$OUT/balanced_tests.log"
grep -v "PytestBenchmarkWarning\|warner(\|CUDAGraph.cpp" "$OUT/balanced_tests.log" | tail -25
timeout 150 python3 benchmarks/gpu_attention.py --decode-only --skewed 2>&1 \
  | tee "$OUT/gpu_attention_decode.log"
echo "gpu_balanced_run: $((SECONDS - start)) s after the build"
