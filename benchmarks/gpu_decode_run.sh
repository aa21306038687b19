#!/usr/bin/env bash
# The decode kernels' GPU run (H100): CUDA build, the decode / graph CUDA tests on both kernels
# (PAGEDKV_DECODE_MMA=0: CUDA-core, =1: tensor-core), then the decode table of
# gpu_attention.py on each kernel and the variants table. Logs go to $OUT (default ./gpu_out).
#   bash benchmarks/gpu_decode_run.sh        (SKIP_BUILD=1 to reuse an installed CUDA build)
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
T="tests/python/test_decode_mma_cuda.py tests/python/test_ops_cuda.py tests/python/test_cuda_graph.py"
for mma in 1 0; do
  PAGEDKV_DECODE_MMA=$mma timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider $T \
    -k "decode or graph or partition" 2>&1 | tail -15 | tee "$OUT/tests_mma$mma.log"
done
for mma in 1 0; do
  PAGEDKV_DECODE_MMA=$mma timeout 90 python3 benchmarks/gpu_attention.py --decode-only 2>&1 \
    | tee "$OUT/decode_mma$mma.log"
done
timeout 100 python3 benchmarks/decode_variants.py 2>&1 | tee "$OUT/variants.log"
