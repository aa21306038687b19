#!/usr/bin/env bash
# Structured outputs on the GPU (< 4 minutes on an installed CUDA build): the structured-output
# engine tests (CPU model, a sanity check that xgrammar is installed there), then batch-64
# decode throughput with every request under a JSON schema vs unconstrained, on the default
# model (benchmarks/structured_throughput.py; target: <= 5 % slower). Logs go to $OUT.
#   SKIP_BUILD=1 bash benchmarks/gpu_structured_run.sh     (reuses the installed CUDA build)
# Needs xgrammar installed (scripts/install_deps.py's engine group).
set -uo pipefail
source "$(dirname "$0")/gpu_setup.sh"  # $OUT, CUDA build (SKIP_BUILD=1 skips it)
python3 -c "import importlib.metadata as m, xgrammar; print('xgrammar', m.version('xgrammar'))" | tee "$OUT/xgrammar.txt" \
  || { echo "xgrammar is not installed: pip install xgrammar"; exit 1; }
timeout 150 python3 benchmarks/structured_throughput.py --device cuda --batch 64 \
  --max-tokens 256 --rounds 3 --json "$OUT/structured_throughput.json" 2>&1 \
  | grep -v "Loading GGUF" | tee "$OUT/structured_throughput.log"
(cd tests/python && timeout 60 python3 -m pytest -q -p no:cacheprovider -x --tb=short \
  engine/test_engine_structured_output.py -k "json_schema or regex_choice" \
  > "$OUT/structured_tests.log" 2>&1); tail -5 "$OUT/structured_tests.log"
