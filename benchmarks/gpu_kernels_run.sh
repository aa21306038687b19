#!/usr/bin/env bash
# The kernels' GPU run (H100): CUDA build, every CUDA-marked test (ops, decode / prefill kernels,
# graphs, engine), the gpu_attention.py table; VARIANTS=1 adds decode_variants.py, PROFILE=1 an
# Nsight Compute profile of the decode (bf16, fp8) and prefill kernels on benchmark shapes.
# Logs go to $OUT (default ./gpu_out).
#   bash benchmarks/gpu_kernels_run.sh      (SKIP_BUILD=1 reuses an installed CUDA build)
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
timeout 300 python3 -m pytest -q -n 8 -p no:cacheprovider -m cuda tests/python -rfEs --tb=short \
  > "$OUT/cuda_tests.log" 2>&1
grep -v "PytestBenchmarkWarning\|warner(\|CUDAGraph.cpp" "$OUT/cuda_tests.log" | tail -30
timeout 150 python3 benchmarks/gpu_attention.py 2>&1 | tee "$OUT/gpu_attention.log"
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
