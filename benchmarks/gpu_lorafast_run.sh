#!/usr/bin/env bash
# LoRA through torch._grouped_mm, GPU run (< 4 minutes on an installed CUDA build): the CUDA
# tests of both LoRA kernels (graph capture + replay with new slots, the engine's graphs with
# lora_kernel=grouped_mm vs pagedkv, the core's BGMV ops), one layer's cost per kernel
# (benchmarks/lora_ops_bench.py, 1B shapes, graph replays), then benchmarks/lora_bench.py
# (8 rank-16 adapters over 256 requests vs no adapter, random 1B Llama) for grouped_mm and
# pagedkv in one run. Logs go to $OUT (default ./gpu_out).
#   SKIP_BUILD=1 bash benchmarks/gpu_lorafast_run.sh     (reuses the installed CUDA build)
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
timeout 70 python3 -m pytest -q -p no:cacheprovider -m cuda -rfEs --tb=short \
  tests/python/kernels/test_lora_grouped_mm_cuda.py tests/python/kernels/test_lora_cuda.py \
  tests/python/engine/test_lora_engine.py > "$OUT/lorafast_cuda_tests.log" 2>&1
tail -15 "$OUT/lorafast_cuda_tests.log"
timeout 30 python3 benchmarks/lora_ops_bench.py --json "$OUT/lora_ops.json" 2>&1 \
  | tee "$OUT/lora_ops.log" | tail -10
timeout 140 python3 benchmarks/lora_bench.py --model-dir /tmp/llama1b \
  --json "$OUT/lora_bench.json" 2>&1 | tee "$OUT/lora_bench.log" | tail -30
