#!/usr/bin/env bash
# The engine's GPU run (H100): CUDA build, the engine's CUDA tests, then throughput vs HF on a
# random-weight ~1B Llama with the greedy agreement check. Logs go to $OUT (default ./gpu_out).
#   bash benchmarks/engine_gpu_run.sh        (SKIP_BUILD=1 to reuse an installed CUDA build)
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PAGEDKV_CUDA=ON PAGEDKV_CUDA_ARCHS=${PAGEDKV_CUDA_ARCHS:-90a}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
if [ -z "${SKIP_BUILD:-}" ]; then  # SKIP_BUILD=1: pagedkv is already installed with CUDA
  python3 -m pip install --no-build-isolation --no-deps -q ${PAGEDKV_PIP_ARGS:-} . > "$OUT/build.log" 2>&1 \
    || { grep -n -B2 -A12 "error\|FAILED" "$OUT/build.log" | head -60; exit 1; }
fi
python3 -c "import pagedkv, torch; print(pagedkv.build_info(), torch.__version__)" \
  | tee -a "$OUT/build.log"
# Full log kept; the console shows the failures' short tracebacks and the summary (torch's
# per-graph CUDA warnings, if any, are counted rather than allowed to bury them).
timeout 180 python3 -m pytest tests/python/test_engine_cuda.py -q -p no:cacheprovider \
  --tb=short -rfE > "$OUT/engine_cuda_tests.log" 2>&1
echo "CUDAGraph.cpp warnings: $(grep -c CUDAGraph.cpp "$OUT/engine_cuda_tests.log")"
grep -v "CUDAGraph.cpp" "$OUT/engine_cuda_tests.log" | tail -60
timeout 330 python3 benchmarks/throughput.py --random-llama-1b /tmp/llama1b --device cuda \
  --num-prompts "${NUM_PROMPTS:-256}" --input-len 128 --output-len 256 \
  --hf-batch-sizes "${HF_BATCHES:-all,32}" --check 4 --json "$OUT/throughput.json" 2>&1 \
  | grep -v "it/s\]" | tail -40 | tee "$OUT/throughput.log"
