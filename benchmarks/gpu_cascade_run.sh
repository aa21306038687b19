#!/usr/bin/env bash
# Issue #32's cascade GPU run, under 5 minutes on an installed CUDA build (SKIP_BUILD=1):
#  1. CUDA tests: the cascade and balanced kernels vs float64 (test_decode_balanced_cuda.py), the
#     engine's cascade on eager steps and as the CUDA graphs' cascade variant vs
#     disable_cascade_attn=True, device-tensor fp8 scales (graph replays read the new value),
#     fused_experts' auto rule on the MoE kernels;
#  2. gpu_attention.py's cascade table (64 x (8192 shared + 256 own) first; target >= 3x the
#     plain decode) and the low end of the engine's rule;
#  3. the engine: 64 requests on one 8k-token system prompt, 128-256 new tokens, CUDA graphs,
#     cascade on vs off (cascade_engine.py: tok/s and the decode step);
#  4. the uniform decode table vs cuDNN (gpu_attention.py --decode-only; target >= 1.0x);
#  5. the MoE auto rule's evidence: Qwen3-30B-A3B's layer at 1-256 tokens, both kernels named.
# Logs go to $OUT (default ./gpu_out).
#   SKIP_BUILD=1 bash benchmarks/gpu_cascade_run.sh
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
start=$SECONDS
timeout 90 python3 -m pytest -q -n 8 -p no:cacheprovider -m cuda -rfEs --tb=short \
  tests/python/kernels/test_decode_balanced_cuda.py tests/python/kernels/test_cascade_graph_cuda.py \
  tests/python/engine/test_balanced_decode_engine_cuda.py \
  tests/python/kernels/test_scale_arrays_cuda.py tests/python/kernels/test_moe_cuda.py \
  > "$OUT/cascade_tests.log" 2>&1
echo "pytest exit $? after $((SECONDS - start)) s" | tee -a "$OUT/cascade_tests.log"
grep -v "PytestBenchmarkWarning\|warner(\|CUDAGraph.cpp" "$OUT/cascade_tests.log" | tail -25
timeout 40 python3 benchmarks/gpu_attention.py --cascade-only 2>&1 | tee "$OUT/cascade_kernel.log"
timeout 70 python3 benchmarks/cascade_engine.py --json "$OUT/cascade_engine.json" 2>&1 \
  | grep -v "^INFO\|Loading weights" | tee "$OUT/cascade_engine.log"
timeout 60 python3 benchmarks/gpu_attention.py --decode-only 2>&1 | tee "$OUT/decode_uniform.log"
timeout 30 python3 benchmarks/moe.py --skip-engine --skip-hf-loop --shape qwen3-30b-a3b \
  --tokens 1,16,32,64,128,256 --json "$OUT/moe_auto.json" 2>&1 | tee "$OUT/moe_auto.log"
echo "gpu_cascade_run: $((SECONDS - start)) s after the build"
