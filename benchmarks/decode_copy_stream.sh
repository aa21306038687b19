# The tables of RESULTS.md "The decode's copy pattern alone": builds decode_copy_stream.cu and runs
# it on the benchmark shapes (Hq=32, Hkv=8, head size 128, blocks of 16; row=256 is a bf16 cache,
# row=128 an fp8 one, with the split-K sizes and ring shapes the Hopper decode uses), then the
# kernel's pieces one by one, then a per-chunk "math" delay against the ring's shape.
#   bash benchmarks/decode_copy_stream.sh        (needs nvcc and an sm_90 GPU)
set -euo pipefail
BIN=${BIN:-/tmp/decode_copy_stream}
ROOT="$(dirname "$0")/.."
nvcc -O3 -std=c++17 -arch=sm_90a -I"$ROOT/src" -I"$ROOT/include" -o "$BIN" \
  "$ROOT/benchmarks/decode_copy_stream.cu" "$ROOT/src/ops/cuda/tensor_map.cu"
BF16="row=256 stages=2 ctas=3"
FP8="row=128 stages=3 ctas=4"
echo "== the pattern alone, as the decode runs each shape (bf16, then fp8)"
for shape in "seqs=1 len=4096 part=256" "seqs=1 len=32768 part=2048/512" "seqs=16 len=4096 part=0/1024" \
             "seqs=64 len=2048 part=0" "seqs=256 len=512 part=0" "seqs=32 len=8192 part=0/4096"; do
  set -- $shape
  bf_part=${3#part=}; bf_part=${bf_part%/*}; fp_part=${3##*/}; fp_part=${fp_part#part=}
  "$BIN" $BF16 "$1" "$2" "part=$bf_part"
  "$BIN" $FP8 "$1" "$2" "part=$fp_part"
done
echo "== the same pattern with the cache stored head-major (hnd) or each sequence's blocks in order"
for extra in hnd=1 seq_order=1; do
  "$BIN" $BF16 seqs=64 len=2048 $extra
  "$BIN" $FP8 seqs=64 len=2048 $extra
done
echo "== the kernel's other work, one piece at a time, then all of it"
for piece in "" lookahead=1 prologue=1 pdl=1 epilogue=1 "lookahead=1 prologue=1 pdl=1 epilogue=1"; do
  "$BIN" $FP8 seqs=64 len=2048 $piece
  "$BIN" $BF16 seqs=16 len=4096 $piece
done
echo "== a per-chunk delay (the math, in cycles) against the ring's shape"
for d in 0 400 800 1600; do
  "$BIN" $FP8 seqs=64 len=2048 delay=$d
  "$BIN" row=128 stages=4 ctas=3 seqs=64 len=2048 delay=$d
  "$BIN" row=128 warps=8 stages=3 ctas=2 seqs=64 len=2048 delay=$d
  "$BIN" $BF16 seqs=64 len=2048 delay=$d
  "$BIN" row=256 warps=8 stages=3 ctas=1 seqs=64 len=2048 delay=$d
done
