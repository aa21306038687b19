#!/usr/bin/env bash
# LLaVA image inputs on the GPU (< 2 minutes on an installed CUDA build): the tiny random LLaVA
# through the CUDA kernels (float32) equal to HF's generate, plus the CPU and server image tests
# (tests/python/models/test_models_llava.py, tests/python/server/test_server_llava_images.py).
# Logs go to $OUT (default ./gpu_out).
#   SKIP_BUILD=1 bash benchmarks/gpu_llava_run.sh     (reuses the installed CUDA build)
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short \
  tests/python/models/test_models_llava.py tests/python/server/test_server_llava_images.py \
  > "$OUT/llava_tests.log" 2>&1
tail -15 "$OUT/llava_tests.log"
