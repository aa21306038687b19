#!/usr/bin/env bash
# Issue #29's 2-GPU run (tpfast): benchmarks/gpu_parallel_run.sh on the full 32-layer
# Llama-3-8B shape, without its CPU pipeline step, in under 6 minutes on an installed CUDA
# build: the 2-GPU CUDA tests, TP=1 vs TP=2 at batch 1/32/256 (serial and overlapped loops),
# the all-reduce latency (NCCL and the symmetric-memory one-shot), the command transport and
# the per-step host breakdown. Logs and summary.md under $OUT.
#   OUT=/tmp/out bash benchmarks/gpu_tpfast_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-./gpu_out} LAYERS=${LAYERS:-32} SKIP_PIPELINE=1
exec bash benchmarks/gpu_parallel_run.sh "$@"
