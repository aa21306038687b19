# Sourced by the GPU run scripts (gpu_kernels_run.sh, engine_gpu_run.sh):
# logs folder, CUDA build settings, the card's identity, and the CUDA build itself unless
# SKIP_BUILD=1 says pagedkv is already installed with CUDA (e.g. by the previous script).
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PAGEDKV_CUDA=ON PAGEDKV_CUDA_ARCHS=${PAGEDKV_CUDA_ARCHS:-90a}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
if [ -z "${SKIP_BUILD:-}" ]; then
  python3 -m pip install --no-build-isolation --no-deps -q ${PAGEDKV_PIP_ARGS:-} . \
    > "$OUT/build.log" 2>&1 \
    || { grep -n -B2 -A12 "error\|FAILED" "$OUT/build.log" | head -60; exit 1; }
fi
python3 -c "import pagedkv, torch; print(pagedkv.build_info(), torch.__version__)" \
  | tee -a "$OUT/build.log"
