#!/usr/bin/env bash
# The encoders' GPU run (#31, branch bert): non-causal prefill (causal=False) on each CUDA prefill
# kernel, named (hopper / tensor_core / cuda_core) against the float64 reference, then the causal
# prefill tests the change touched (regression), and the BERT / XLM-R model tests. Logs in $OUT.
#   SKIP_BUILD=1 bash benchmarks/gpu_bert_run.sh    (reuses an installed CUDA build)
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
T=tests/python
timeout 90 python3 -m pytest $T/kernels/test_prefill_noncausal_cuda.py -q -p no:cacheprovider \
  --tb=short -rfE > "$OUT/noncausal_cuda.log" 2>&1
tail -5 "$OUT/noncausal_cuda.log"
timeout 100 python3 -m pytest $T/kernels/test_ops_cuda.py $T/kernels/test_prefill_mma_cuda.py -q \
  -k "prefill" -p no:cacheprovider --tb=short -rfE > "$OUT/prefill_cuda.log" 2>&1
tail -5 "$OUT/prefill_cuda.log"
timeout 60 python3 -m pytest $T/models/test_models_bert.py $T/ops/test_ops_noncausal.py -q \
  -p no:cacheprovider --tb=short -rfE > "$OUT/bert_models.log" 2>&1
tail -3 "$OUT/bert_models.log"
