#!/usr/bin/env bash
# A/B on one GPU machine, step 1: build this tree (installed) and a base commit's tree (into
# /tmp/base) with CUDA for sm_90a, side by side. The base tree is carried in .base:
#   git archive BASE_COMMIT | tar -x -C .base        (here, before the device call)
#   bash benchmarks/gpu_ab_build.sh                   (there; logs under $OUT)
# then benchmarks/gpu_ab_kernels.sh, or anything run with PYTHONPATH=/tmp/base for the base.
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PAGEDKV_CUDA=ON PAGEDKV_CUDA_ARCHS=${PAGEDKV_CUDA_ARCHS:-90a}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-8}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
t0=$(date +%s)
if [ -d .base ] && [ ! -d /tmp/base/pagedkv ]; then
  (cd .base && python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/base . \
     > "$OUT/build_base.log" 2>&1; echo "base rc $? after $(( $(date +%s) - t0 )) s" >> "$OUT/build_base.log") &
fi
python3 -m pip install --no-build-isolation --no-deps -q . > "$OUT/build.log" 2>&1
echo "head rc $? after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/build.log"
grep -n -B2 -A10 " error\|FAILED" "$OUT/build.log" | head -60
wait
tail -2 "$OUT/build_base.log" 2>/dev/null
python3 -c "import pagedkv; print(pagedkv.build_info())"
[ -d /tmp/base/pagedkv ] && PYTHONPATH=/tmp/base python3 -c "import pagedkv; print('base', pagedkv.build_info())"
exit 0
