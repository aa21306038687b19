#!/usr/bin/env bash
# The fused ops' GPU run (< 4 minutes on an installed CUDA build): the CUDA tests of the layer
# ops and of GPU sampling, then the benchmarks/fused_ops.py table (each op vs torch eager,
# torch.compile and the card's copy bandwidth). Logs go to $OUT (default ./gpu_out).
#   SKIP_BUILD=1 bash benchmarks/gpu_fused_run.sh     (reuses the installed CUDA build)
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
timeout 70 python3 -m pytest -q -p no:cacheprovider -m cuda -rfEs --tb=short \
  tests/python/kernels/test_layer_ops_cuda.py tests/python/engine/test_engine_sampler_gpu.py \
  > "$OUT/fused_cuda_tests.log" 2>&1
tail -15 "$OUT/fused_cuda_tests.log"
timeout 160 python3 benchmarks/fused_ops.py --json "$OUT/fused_ops.json" 2>&1 \
  | tee "$OUT/fused_ops.log"
