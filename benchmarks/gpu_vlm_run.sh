#!/usr/bin/env bash
# Image models on the GPU (< 4 minutes on an installed CUDA build): the tiny random LLaVA-1.5,
# LLaVA-NeXT and Qwen2-VL checkpoints through the CUDA kernels (float32) equal to HF's generate
# on the CPU (tokens; LLaVA-NeXT and Qwen2-VL also logprobs within 2e-3), only the CUDA tests
# (-k cuda) of tests/python/models/test_models_{llava,llava_next,qwen2_vl}.py. Qwen2-VL's prompt
# chunks with images run eager ([3, T] M-RoPE positions); decodes replay CUDA graphs at index +
# delta (CudaGraphRunner.run(positions=)).
# Logs go to $OUT (default ./gpu_out).
#   SKIP_BUILD=1 bash benchmarks/gpu_vlm_run.sh     (reuses the installed CUDA build)
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
timeout 220 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -k cuda \
  tests/python/models/test_models_llava.py tests/python/models/test_models_llava_next.py \
  tests/python/models/test_models_qwen2_vl.py > "$OUT/vlm_cuda_tests.log" 2>&1
tail -15 "$OUT/vlm_cuda_tests.log"
