#!/usr/bin/env bash
# The kernels' GPU run (H100 / H200), one call, about 5-7 minutes after the build: every
# CUDA-marked test (ops, decode / prefill kernels, tensor scales, graphs, engine), then the
# gpu_attention.py table. Logs go to $OUT (default ./gpu_out).
#   bash benchmarks/gpu_kernels_run.sh      (SKIP_BUILD=1 reuses an installed CUDA build)
# A/B on the same card: BASE_TARGET=<folder> (a pre-change build installed there with
# `pip install --target <folder> .`) also times the table on it, right after ours
# (gpu_attention_base.log), so "no kernel slower than before" is measured on one machine.
# VARIANTS=1 adds decode_variants.py (the three decode kernels side by side), PROFILE=1 an Nsight
# Compute profile of the decode (bf16, fp8) and prefill kernels on benchmark shapes.
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
start=$SECONDS
timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider -m cuda tests/python -rfEs --tb=short \
  > "$OUT/cuda_tests.log" 2>&1
echo "pytest exit $? after $((SECONDS - start)) s" | tee -a "$OUT/cuda_tests.log"
grep -v "PytestBenchmarkWarning\|warner(\|CUDAGraph.cpp" "$OUT/cuda_tests.log" | tail -30
timeout 150 python3 benchmarks/gpu_attention.py 2>&1 | tee "$OUT/gpu_attention.log"
if [ -n "${BASE_TARGET:-}" ]; then
  # The pre-change build first on the path; gpu_attention.py runs on either API.
  PYTHONPATH="$BASE_TARGET${PYTHONPATH:+:$PYTHONPATH}" timeout 150 python3 \
    benchmarks/gpu_attention.py 2>&1 | tee "$OUT/gpu_attention_base.log"
fi
if [ -n "${VARIANTS:-}" ]; then
  timeout 100 python3 benchmarks/decode_variants.py 2>&1 | tee "$OUT/variants.log"
fi
if [ -n "${PROFILE:-}" ]; then
  NCU="ncu --clock-control none -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis
       --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats"
  cd benchmarks
  for c in "decode 32 8192 auto" "decode 32 8192 fp8" "decode 256 512 auto"; do
    timeout 60 $NCU -k "regex:decode_mma|decode_bulk" python3 ncu_driver.py $c > "$OUT/ncu_${c// /_}.txt" 2>&1
  done
  # Prefill: the Hopper (wgmma) kernel with every section, stall reasons per source line included
  # (--import-source lets `ncu -i prefill.ncu-rep --page source` map them to the .cuh lines).
  for c in "prefill 1 8192" "prefill 32 512"; do
    timeout 120 ncu --clock-control none -c 1 --set full --import-source yes \
      -k regex:prefill_wgmma -o "$OUT/ncu_${c// /_}" -f python3 ncu_driver.py $c > /dev/null 2>&1
    ncu -i "$OUT/ncu_${c// /_}.ncu-rep" > "$OUT/ncu_${c// /_}.txt" 2>&1
    ncu -i "$OUT/ncu_${c// /_}.ncu-rep" --page source --csv --print-source sass \
      2>&1 | gzip > "$OUT/ncu_${c// /_}_sass.csv.gz"
  done
  cd ..
  tail -n 4 "$OUT"/ncu_*.txt | head -20
fi
echo "gpu_kernels_run: $((SECONDS - start)) s after the build"
