#!/usr/bin/env bash
# Beam search's GPU run (< 4 minutes on an installed CUDA build): LLM.beam_search on CUDA equal
# to HF's beam search (tests/python/engine/test_beam_search_cuda.py), then benchmarks/
# beam_search.py on the default model (beam width 4 vs plain decoding of as many sequences,
# and the prefix-cache hit rate of the beams). Logs go to $OUT (default ./gpu_out).
#   SKIP_BUILD=1 bash benchmarks/gpu_beam_run.sh     (reuses the installed CUDA build)
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
timeout 90 python3 -m pytest -q -p no:cacheprovider -m cuda -rfEs --tb=short \
  tests/python/engine/test_beam_search_cuda.py > "$OUT/beam_cuda_tests.log" 2>&1
tail -15 "$OUT/beam_cuda_tests.log"
timeout 120 python3 benchmarks/beam_search.py --device cuda --prompts 16 --beam-width 4 \
  --max-tokens 64 --json "$OUT/beam_search.json" 2>&1 | tee "$OUT/beam_search.log" | tail -15
