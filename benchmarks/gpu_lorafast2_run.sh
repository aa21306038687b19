#!/usr/bin/env bash
# LoRA step speed (#31), GPU run (< 4 minutes on an installed CUDA build): the CUDA tests of the
# LoRA kernels (dense / grouped_mm / pagedkv_tiled graph capture + replay with new slots, the
# engine's graphs per kernel vs HF's merged models and vs the core's BGMV, the core's ops in both
# variants), one layer's cost per kernel (benchmarks/lora_ops_bench.py, 1B shapes, graph
# replays), then benchmarks/lora_bench.py (8 rank-16 adapters over 256 requests vs no adapter,
# random 1B Llama) for dense, grouped_mm and pagedkv_tiled (pagedkv: 0.23x, measured before),
# each engine then profiling 20 decode steps with and without adapters (top kernels + per-step
# delta: benchmarks/lora_profile.py). Logs go to $OUT; the full
# profile tables are in $OUT/lora_bench.log and $OUT/lora_bench.json.
#   SKIP_BUILD=1 bash benchmarks/gpu_lorafast2_run.sh
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
timeout 70 python3 -m pytest -q -p no:cacheprovider -m cuda -rfEs --tb=short \
  tests/python/kernels/test_lora_grouped_mm_cuda.py tests/python/kernels/test_lora_cuda.py \
  tests/python/engine/test_lora_engine.py > "$OUT/lorafast2_cuda_tests.log" 2>&1
tail -12 "$OUT/lorafast2_cuda_tests.log"
timeout 20 python3 benchmarks/lora_ops_bench.py --json "$OUT/lora_ops.json" 2>&1 \
  | tee "$OUT/lora_ops.log" | tail -8
# The JSON is written after each kernel: a timeout keeps the kernels finished before it.
timeout 140 python3 benchmarks/lora_bench.py --model-dir /tmp/llama1b --profile-steps 20 \
  --kernel dense grouped_mm pagedkv_tiled \
  --json "$OUT/lora_bench.json" > "$OUT/lora_bench.log" 2>&1
grep '^{"' "$OUT/lora_bench.log" | cut -c1-400
python3 - "$OUT/lora_bench.json" <<'PY'
import json, sys
res = json.load(open(sys.argv[1]))
for kernel, row in res.items():
    if not isinstance(row, dict) or "profile" not in row:
        continue
    prof = row["profile"]
    print(f"\n## {kernel}: ratio {row['ratio']:.3f} per step {json.dumps(prof['per_step'])}")
    print("   LoRA - base us/step, launches/step, kernel:")
    for r in prof["delta"][:12]:
        print(f"   {r['delta_us_per_step']:9.1f} {r['delta_launches']:6.1f}  {r['kernel'][:90]}")
PY
