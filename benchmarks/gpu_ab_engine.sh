#!/usr/bin/env bash
# A/B on one GPU machine, step 3 (after gpu_ab_build.sh): engine throughput of the base (.base's
# own benchmarks/throughput.py on /tmp/base) and of this tree on a random-weight ~1B Llama
# (bf16, 256 prompts, 128 in / 256 out, greedy, CUDA graphs), ABAB; this tree's first run also
# times HF transformers' generate on the same prompts and checks greedy agreement. Logs under $OUT.
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
args="--device cuda --num-prompts ${NUM_PROMPTS:-256} --input-len 128 --output-len 256 --skip-hf-cb"
for round in 1 2; do
  (cd .base && PYTHONPATH=/tmp/base timeout 150 python3 benchmarks/throughput.py \
     --random-llama-1b /tmp/llama1b_base $args --skip-hf) > "$OUT/engine_base_$round.log" 2>&1
  extra="--skip-hf"; [ "$round" = 1 ] && extra="--hf-batch-sizes all --check 4"
  timeout 200 python3 benchmarks/throughput.py --random-llama-1b /tmp/llama1b_head $args $extra \
    --json "$OUT/engine_head_$round.json" > "$OUT/engine_head_$round.log" 2>&1
done
for f in "$OUT"/engine_*.log; do echo "== $f"; grep -v "it/s\]" "$f" | tail -14; done
