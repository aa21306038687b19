#!/usr/bin/env bash
# The engine's GPU run (H100): CUDA build, the engine's CUDA tests, then throughput vs HF on a
# random-weight ~1B Llama with the greedy agreement check. Logs go to $OUT (default ./gpu_out).
#   bash benchmarks/engine_gpu_run.sh        (SKIP_BUILD=1 to reuse an installed CUDA build)
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
# Full log kept; the console shows the failures' short tracebacks and the summary (torch's
# per-graph CUDA warnings, if any, are counted rather than allowed to bury them).
timeout 180 python3 -m pytest tests/python/engine/test_engine_cuda.py -q -p no:cacheprovider \
  --tb=short -rfE > "$OUT/engine_cuda_tests.log" 2>&1
echo "CUDAGraph.cpp warnings: $(grep -c CUDAGraph.cpp "$OUT/engine_cuda_tests.log")"
grep -v "CUDAGraph.cpp" "$OUT/engine_cuda_tests.log" | tail -60
timeout 330 python3 benchmarks/throughput.py --random-llama-1b /tmp/llama1b --device cuda \
  --num-prompts "${NUM_PROMPTS:-256}" --input-len 128 --output-len 256 \
  --hf-batch-sizes "${HF_BATCHES:-all,32}" --check 4 --json "$OUT/throughput.json" 2>&1 \
  | grep -v "it/s\]" | tail -40 | tee "$OUT/throughput.log"
