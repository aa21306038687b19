#!/usr/bin/env bash
# Issue #28 on the GPU (< 8 minutes on an installed CUDA build, H100 or H200): the overlapped
# loop's CUDA exactness tests (serial vs overlapped tokens, CUDA graphs, pinned copies), then
# benchmarks/gpu_engine_table.py: pagedkv serial / async vs HF generate and HF continuous
# batching on a random ~1B and a random Llama-3-8B-shaped model, four workloads, decode step vs
# roofline, GPU-busy fraction of the decode phase (CUDA events around each step, gpu_engine_table.py).
#   SKIP_BUILD=1 bash benchmarks/gpu_overlap_run.sh     (reuses the installed CUDA build)
# The random models are written to $TABLE_DIR (default /tmp/engine_table; the 8B one is 16 GB,
# ~1 min to write the first time).
# OVERLAP_PART=tests or table runs that part alone; TABLE_ARGS go to gpu_engine_table.py (e.g.
# "--models 8b": one model per call, so that a long 8B run cannot cost the 1B one its table),
# TABLE_TIMEOUT (default 380 s) bounds it.
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
read -ra TABLE_ARGS <<< "${TABLE_ARGS:-}"
PART=${OVERLAP_PART:-all}
if [ "$PART" != table ]; then
  (cd tests/python && timeout 90 python3 -m pytest -q -p no:cacheprovider --tb=short \
    engine/test_engine_overlap_cuda.py engine/test_engine_overlap_modes.py \
    > "$OUT/overlap_tests.log" 2>&1); tail -5 "$OUT/overlap_tests.log"
fi
[ "$PART" = tests ] && exit 0
timeout "${TABLE_TIMEOUT:-380}" python3 benchmarks/gpu_engine_table.py \
  --dir "${TABLE_DIR:-/tmp/engine_table}" "${TABLE_ARGS[@]}" --out "$OUT/engine_table.json" 2>&1 \
  | grep -v "Loading\|INFO\|it/s\]" | tee "$OUT/engine_table.log"
