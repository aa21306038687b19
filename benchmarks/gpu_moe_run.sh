#!/usr/bin/env bash
# The MoE / quantization GPU run (H100 / H200, under 4 minutes on an installed CUDA build):
# the CUDA tests of the MoE and int4 kernels (vs float64, graph capture, fp8 through
# torch._scaled_mm), the MoE and quantized-model tests, then benchmarks/moe.py (FusedMoE layer
# vs the dense MLP of the same active size and HF's per-expert loop; engine tokens/s of a
# Mixtral-shaped model vs its dense twin) and benchmarks/quant.py (int4 / fp8 GEMMs vs bf16).
# Logs, moe.json and quant.json go to $OUT (default ./gpu_out).
#   SKIP_BUILD=1 bash benchmarks/gpu_moe_run.sh
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
timeout 100 python3 -m pytest tests/python/kernels/test_moe_cuda.py \
  tests/python/kernels/test_quant_cuda.py tests/python/ops/test_moe_ops.py \
  tests/python/models/test_models_moe.py tests/python/models/test_models_quantized.py \
  -q -p no:cacheprovider --tb=short -rfE > "$OUT/moe_tests.log" 2>&1
tail -30 "$OUT/moe_tests.log"
timeout 110 python3 benchmarks/moe.py --device cuda --json "$OUT/moe.json" 2>&1 \
  | grep -v "it/s\]" | tail -30 | tee "$OUT/moe_bench.log"
timeout 30 python3 benchmarks/quant.py --json "$OUT/quant.json" 2>&1 | tail -20 \
  | tee "$OUT/quant_bench.log"
