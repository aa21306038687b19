#!/usr/bin/env bash
# Tensor parallelism on a 2-GPU machine (H100/H200), on an installed CUDA build of pagedkv:
#   1. the CUDA tests of TP=2 / PP=2 / TP=2 fp8 engines against one GPU (CUDA graphs on),
#   2. NCCL all-reduce latency at decode sizes ([batch, 4096] bf16; eager and in a CUDA graph),
#   3. TP=1 vs TP=2 on a random-weight Llama-3-8B-shaped bf16 model: decode throughput at batch
#      1/32/256, prefill TFLOP/s, greedy agreement; then the side-by-side table (summary.md).
# Logs and JSON go to $OUT (default ./gpu_out). Every step runs under `timeout`, and the
# process groups have timeouts too (the engine's init_process_group: 600 s, the all-reduce
# benchmark's: 60 s; TORCH_NCCL_ASYNC_ERROR_HANDLING=1 turns a stuck collective into an error).
# Expected: ~3.5 min. LAYERS=8 cuts the model to 8 layers if the time is short.
#   bash benchmarks/gpu_parallel_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu_out}
mkdir -p "$OUT"
CKPT=${CKPT:-/tmp/llama8b-parallel}
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1 NCCL_DEBUG=${NCCL_DEBUG:-WARN}
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpus.txt" 2>&1
cat "$OUT/gpus.txt"
BENCH="python3 benchmarks/parallel_bench.py"

echo "== CUDA tests (2 GPUs)"
timeout -k 5 75 python3 -m pytest tests/python/engine/test_engine_parallel_cuda.py -q \
  -p no:cacheprovider --tb=short -rfE > "$OUT/parallel_cuda_tests.log" 2>&1
echo "exit $?"; tail -25 "$OUT/parallel_cuda_tests.log"

echo "== NCCL all-reduce latency"
timeout -k 5 30 $BENCH allreduce --out "$OUT/allreduce.json" 2>&1 | tail -5

echo "== random Llama-3-8B-shaped checkpoint"
timeout -k 5 60 $BENCH write --dir "$CKPT" --layers "${LAYERS:-0}" 2>&1 | tail -2
cp "$CKPT/config.json" "$OUT/config.json"

for tp in 1 2; do
  echo "== engine, tensor_parallel_size=$tp"
  timeout -k 5 75 $BENCH engine --dir "$CKPT" --tp $tp --out "$OUT/tp$tp.json" \
    > "$OUT/engine_tp$tp.log" 2>&1
  echo "exit $?"; grep -E "^tp=|Error|error" "$OUT/engine_tp$tp.log" | tail -12
done

echo "== summary"
$BENCH report --out-dir "$OUT"
# No worker may outlive its engine.
if pgrep -f "multiprocessing.spawn" > /dev/null; then
  echo "LEFTOVER PROCESSES:"; pgrep -af "multiprocessing.spawn"
fi
