#!/usr/bin/env bash
# The work-balanced and cascade decode's GPU run (issue #32), under 4 minutes on an installed CUDA
# build: their CUDA tests (balanced random cases and cascade vs float64, a CUDA graph replaying a
# refilled plan, refusals, the engine's eager balanced steps) with the Hopper decode's own tests
# (its kernel changed), then gpu_attention.py's skewed-batch table (ours = the library's choice,
# the previous split-K, the balanced plan at one and two waves, FA2 varlen), the cascade table
# (64 x (8192 shared + 256 own) and two more) and the engine on 64 requests over one 8k system
# prompt (cascade_engine.py). The uniform decode table is gpu_attention.py's default run
# (gpu_kernels_run.sh). Logs go to $OUT (default ./gpu_out).
#   SKIP_BUILD=1 bash benchmarks/gpu_balanced_run.sh
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
start=$SECONDS
timeout 70 python3 -m pytest -q -n 8 -p no:cacheprovider -m cuda -rfEs --tb=short \
  tests/python/kernels/test_decode_balanced_cuda.py tests/python/kernels/test_decode_bulk_cuda.py \
  tests/python/engine/test_balanced_decode_engine_cuda.py > "$OUT/balanced_tests.log" 2>&1
echo "pytest exit $? after $((SECONDS - start)) s" | tee -a "$OUT/balanced_tests.log"
grep -v "PytestBenchmarkWarning\|warner(\|CUDAGraph.cpp" "$OUT/balanced_tests.log" | tail -25
timeout 75 python3 benchmarks/gpu_attention.py --skewed-only 2>&1 | tee "$OUT/skewed.log"
# The cascade table and engine run: benchmarks/gpu_cascade_run.sh.
echo "gpu_balanced_run: $((SECONDS - start)) s after the build"
