#!/usr/bin/env bash
# The MoE GPU run (H100 / H200, under 4 minutes on an installed CUDA build): the MoE CUDA tests
# (kernels vs float64, graph capture), the MoE model tests, then benchmarks/moe.py (FusedMoE
# layer vs the dense MLP of the same active size and vs HF's per-expert loop; engine tokens/s of
# a Mixtral-shaped model vs its dense twin). Logs and moe.json go to $OUT (default ./gpu_out).
#   SKIP_BUILD=1 bash benchmarks/gpu_moe_run.sh
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
timeout 90 python3 -m pytest tests/python/kernels/test_moe_cuda.py tests/python/ops/test_moe_ops.py \
  tests/python/models/test_models_moe.py -q -p no:cacheprovider --tb=short -rfE \
  > "$OUT/moe_tests.log" 2>&1
tail -30 "$OUT/moe_tests.log"
timeout 150 python3 benchmarks/moe.py --device cuda --json "$OUT/moe.json" 2>&1 \
  | grep -v "it/s\]" | tail -30 | tee "$OUT/moe_bench.log"
