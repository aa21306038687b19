#!/usr/bin/env bash
# The prefill kernels' GPU run (H100): CUDA build, the prefill CUDA tests on the BM-128 kernel
# (PAGEDKV_PREFILL_MMA=2; test_prefill_mma_cuda.py sets it itself, test_ops_cuda.py's prefill
# cases and the graph test take it from the environment), then the prefill table of
# gpu_attention.py on the 64-row (1) and the BM-128 (2) kernel. Logs go to $OUT (default
# ./gpu_out).   bash benchmarks/gpu_prefill_run.sh    (SKIP_BUILD=1 reuses an installed build)
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
PAGEDKV_PREFILL_MMA=2 timeout 300 python3 -m pytest -q -n 8 -p no:cacheprovider \
  tests/python/test_prefill_mma_cuda.py tests/python/test_ops_cuda.py \
  tests/python/test_cuda_graph.py -k "prefill or graph or malformed" 2>&1 | tail -15 \
  | tee "$OUT/tests_prefill2.log"
for k in 2 1; do
  PAGEDKV_PREFILL_MMA=$k timeout 120 python3 benchmarks/gpu_attention.py --prefill-only 2>&1 \
    | tee "$OUT/prefill_kernel$k.log"
done
