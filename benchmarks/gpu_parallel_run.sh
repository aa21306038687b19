#!/usr/bin/env bash
# Tensor parallelism on a 2-GPU machine (H100/H200), on an installed CUDA build of pagedkv, in
# one call of under 6 minutes (the whole script runs under `timeout`):
#   1. TP=1 vs TP=2 on a random-weight Llama-3-8B-shaped bf16 model (all 32 layers unless
#      LAYERS=n: fewer layers hide the per-step host work behind less GPU work): decode
#      throughput at batch 1/32/256 in the serial and the overlapped (async_scheduling) loop,
#      prefill TFLOP/s, greedy agreement, CUDA-graph replays on every rank; summary.md
#   2. all-reduce latency at decode sizes ([batch, 4096] bf16; eager and in a CUDA graph): NCCL
#      and torch's symmetric-memory one-shot all-reduce (NVLink peer reads, no multicast)
#   3. the CUDA tests of TP=2 / PP=2 / TP=2 fp8 / overlapped TP=2 (NCCL and one-shot
#      all-reduce) engines and torchrun TP=2 against one GPU
#   4. the per-step command transport on this host's CPUs (pickle over gloo vs flat broadcast vs
#      the shared-memory ring: benchmarks/parallel_step_overhead.py transport)
#   5. TP=2 again with tp_all_reduce=one_shot (rows "... one_shot" in summary.md)
#   6. where a step's host time goes on the driver and a worker (CPU, gloo, tiny model:
#      benchmarks/parallel_step_breakdown.py, serial and overlapped loops)
#   7. PP=2 prefill with pipeline micro-batches off and on, on this host's CPUs (gloo; skipped
#      with SKIP_PIPELINE=1)
# Logs and JSON go to $OUT (default ./gpu_out). Timeouts: each step under `timeout`, the whole
# script under 355 s; the engine's process groups time out after 600 s, and NCCL's watchdog
# (TORCH_NCCL_ASYNC_ERROR_HANDLING=1, heartbeat 60 s) turns a stuck collective into an error;
# the all-reduce benchmark's group times out after 60 s. Workers exit when their driver dies.
#   bash benchmarks/gpu_parallel_run.sh
# A call with more time (benchmarks/gpu_session.sh B) raises the limits: GPU_PARALLEL_LIMIT (the
# whole script, 355 s), ENGINE_TIMEOUT (each engine run, 110 s), TESTS_TIMEOUT (the 2-GPU tests,
# 150 s): on 2 H200s the TP=2 engine run and the tests both ran into theirs (8636d35).
set -uo pipefail
if [ -z "${GPU_PARALLEL_GUARD:-}" ]; then
  GPU_PARALLEL_GUARD=1 exec timeout -k 10 "${GPU_PARALLEL_LIMIT:-355}" bash "$0" "$@"
fi
ET=${ENGINE_TIMEOUT:-110}
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu_out}
mkdir -p "$OUT"
CKPT=${CKPT:-/tmp/llama8b-parallel}
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1 TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=60 NCCL_TIMEOUT=60
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpus.txt" 2>&1
cat "$OUT/gpus.txt"
git log --oneline -1 > "$OUT/commit.txt" 2>/dev/null
BENCH="python3 benchmarks/parallel_bench.py"

LAYERS=${LAYERS:-32}
[ "$LAYERS" = 32 ] || CKPT="$CKPT-$LAYERS"
echo "== random Llama-3-8B-shaped checkpoint ($LAYERS layers)"
timeout -k 5 120 $BENCH write --dir "$CKPT" --layers "$LAYERS" 2>&1 | tail -2
cp "$CKPT/config.json" "$OUT/config.json"

for tp in 1 2; do
  echo "== engine, tensor_parallel_size=$tp"
  timeout -k 5 "$ET" $BENCH engine --dir "$CKPT" --tp $tp --out "$OUT/tp$tp.json" \
    > "$OUT/engine_tp$tp.log" 2>&1
  echo "exit $?"; grep -E "^tp=|Error|error" "$OUT/engine_tp$tp.log" | tail -12
done

echo "== NCCL all-reduce latency"
timeout -k 5 25 $BENCH allreduce --out "$OUT/allreduce.json" 2>&1 | tail -5

echo "== summary"
$BENCH report --out-dir "$OUT"

echo "== CUDA tests (2 GPUs)"
timeout -k 5 "${TESTS_TIMEOUT:-150}" python3 -m pytest tests/python/engine/test_engine_parallel_cuda.py -q \
  -p no:cacheprovider --tb=short -rfE > "$OUT/parallel_cuda_tests.log" 2>&1
echo "exit $?"; tail -25 "$OUT/parallel_cuda_tests.log"

echo "== command transport (CPU, gloo / shared memory)"
timeout -k 5 20 python3 benchmarks/parallel_step_overhead.py transport \
  > "$OUT/transport.log" 2>&1
echo "exit $?"; grep "^transport" "$OUT/transport.log"

echo "== engine, tensor_parallel_size=2, tp_all_reduce=one_shot (symmetric memory)"
timeout -k 5 "$ET" $BENCH engine --dir "$CKPT" --tp 2 --tp-all-reduce one_shot \
  --out "$OUT/tp2_one_shot.json" > "$OUT/engine_tp2_one_shot.log" 2>&1
echo "exit $?"; grep -E "^tp=|Error|error" "$OUT/engine_tp2_one_shot.log" | tail -12
$BENCH report --out-dir "$OUT" | grep -E "one_shot|targets"  # summary.md gains these rows

echo "== host time of a step, driver and worker (CPU, gloo, tiny model)"
for loop in "" --async-scheduling; do
  timeout -k 5 30 python3 benchmarks/parallel_step_breakdown.py $loop --batches 1 32 \
    >> "$OUT/breakdown.log" 2>&1
done
echo "exit $?"; grep -v -E "INFO|Loading" "$OUT/breakdown.log" | head -80

if [ -z "${SKIP_PIPELINE:-}" ]; then
  echo "== pipeline micro-batches (CPU, gloo; last: the first thing the time limit cuts)"
  timeout -k 5 40 python3 benchmarks/parallel_step_overhead.py pipeline > "$OUT/pipeline.log" 2>&1
  echo "exit $?"; grep "^pipeline" "$OUT/pipeline.log"
fi

# No worker may outlive its engine.
if pgrep -f "multiprocessing.spawn" > /dev/null; then
  echo "LEFTOVER PROCESSES:"; pgrep -af "multiprocessing.spawn"
fi
