#!/usr/bin/env bash
# The LoRA GPU run (H100 / H200, under 4 minutes on an installed CUDA build): the CUDA tests of
# the multi-LoRA kernels (vs float64, vs the CPU kernels, graph replay with new indices), the
# CPU op / PEFT model / engine LoRA tests on the CUDA build, then benchmarks/lora_bench.py
# (8 distinct rank-16 adapters over 256 requests vs no adapter on the random ~1B Llama; target
# >= 0.8x). Logs and lora.json go to $OUT (default ./gpu_out).
#   SKIP_BUILD=1 bash benchmarks/gpu_pooling_run.sh
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
timeout 90 python3 -m pytest tests/python/kernels/test_lora_cuda.py \
  tests/python/ops/test_lora_ops.py tests/python/models/test_lora_peft.py \
  tests/python/engine/test_lora_engine.py \
  -q -p no:cacheprovider --tb=short -rfE > "$OUT/lora_tests.log" 2>&1
tail -30 "$OUT/lora_tests.log"
timeout 140 python3 benchmarks/lora_bench.py --model-dir /tmp/llama1b --json "$OUT/lora.json" \
  2>&1 | grep -v "it/s\]" | tail -30 | tee "$OUT/lora_bench.log"
