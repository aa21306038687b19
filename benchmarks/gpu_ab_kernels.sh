#!/usr/bin/env bash
# A/B on one GPU machine, step 2 (after gpu_ab_build.sh): the kernel table of the base (.base's own
# benchmarks/gpu_attention.py on /tmp/base) and of this tree, back to back on one card, in ABAB
# order; then the fused layer ops' table (benchmarks/fused_ops.py). Logs under $OUT.
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for round in 1 2; do
  (cd .base && PYTHONPATH=/tmp/base timeout 150 python3 benchmarks/gpu_attention.py) > "$OUT/attn_base_$round.log" 2>&1
  timeout 150 python3 benchmarks/gpu_attention.py > "$OUT/attn_head_$round.log" 2>&1
done
paste -d'|' <(cut -c1-110 "$OUT/attn_base_1.log") <(cut -c1-110 "$OUT/attn_head_1.log") | head -80
timeout 150 python3 benchmarks/fused_ops.py --json "$OUT/fused_ops.json" > "$OUT/fused_ops.log" 2>&1
tail -40 "$OUT/fused_ops.log"
