#!/usr/bin/env bash
# The engine pipeline's GPU run, on an already-installed CUDA build (about 3 minutes on an
# H100): the overlapped-scheduling CUDA tests, then benchmarks/throughput.py on the random 1B
# Llama timing the serial and the overlapped loop on the same engine, one row each. Logs go to
# $OUT (default ./gpu_out).
#   bash benchmarks/gpu_engine_run.sh  (both loops in one run, with a greedy agreement check)
set -uo pipefail
SKIP_BUILD=1 source "$(dirname "$0")/gpu_setup.sh"  # $OUT and the card's identity; no build
timeout 100 python3 -m pytest tests/python/engine/test_engine_overlap_cuda.py -q \
  -p no:cacheprovider --tb=short -rfE > "$OUT/engine_overlap_cuda_tests.log" 2>&1
grep -v "CUDAGraph.cpp" "$OUT/engine_overlap_cuda_tests.log" | tail -30
timeout 140 python3 benchmarks/throughput.py --random-llama-1b /tmp/llama1b --device cuda \
  --num-prompts "${NUM_PROMPTS:-256}" --input-len 128 --output-len 256 --skip-hf --skip-hf-cb \
  --async-scheduling both --json "$OUT/throughput_overlap.json" 2>&1 \
  | grep -v "it/s\]" | tail -20 | tee "$OUT/throughput_overlap.log"
