#!/usr/bin/env bash
# N-gram speculative decoding on the GPU (< 4 minutes on an installed CUDA build): the CUDA
# greedy-identity test (extend-kernel verification vs decode kernel / CUDA graphs, preemption)
# and the CPU engine tests, then the batch-1 benchmark on the default model with input-grounded
# prompts: acceptance and speed-up vs plain decode (target >= 1.5x where acceptance >= 50 %).
#   SKIP_BUILD=1 bash benchmarks/gpu_spec_run.sh     (reuses the installed CUDA build)
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
(cd tests/python && timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short -m "not slow" \
  engine/test_spec_decode_cuda.py engine/test_spec_decode_engine.py \
  engine/test_spec_decode_verify_layout.py \
  > "$OUT/spec_tests.log" 2>&1); tail -5 "$OUT/spec_tests.log"
timeout 120 python3 benchmarks/spec_decode.py --device cuda --max-tokens 256 --repeats 3 \
  --json "$OUT/spec_decode.json" 2>&1 | grep -v "Loading\|INFO" | tee "$OUT/spec_decode.log"
