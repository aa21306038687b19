// Hopper decode (decode_bulk.cuh): host side. Key rows stream into shared memory by bulk copies
// (one instruction per row, the copy engine does the rest) and the attention runs transposed on
// the tensor cores — keys are the 16 rows of mma.sync m16n8k16 tiles and the query heads of a KV
// group its 8 columns — so a GQA group of 4 wastes half a tile instead of three quarters, the
// output accumulators are half as many registers, and fp8 caches dequantise in registers.
#pragma once

#include <cuda.h>  // CUtensorMap (a plain struct; the driver is reached at run time)

#include "ops/cuda/attention_params.h"

namespace pagedkv::cuda_ops {

// AttnParams plus what the Hopper decode derives on the host. A stage holds a chunk's 16 K rows
// then its 16 V rows, in one of two forms:
//  - tensor copies (tma = 1; row bytes a multiple of 128, block size a multiple of 16): per
//    128-byte column slice of the head dimension, one TMA box of 16 rows lands as 2 KB with the
//    128-byte swizzle (16-byte unit u of row j at unit u ^ (j % 8)), so a chunk costs 2 * slices
//    copies (4 for bf16 with head size 128) instead of 32;
//  - row copies (tma = 0): one 1-D bulk copy per row, rows row bytes + 16 apart.
// Either way the byte of (row j, 16-byte unit c, offset o) is at
//   (c / 8) * box_bytes + j * row_stride + ((c % 8) ^ (j & swz)) * 16 + o.
struct BulkDecodeParams {
  CUtensorMap k_map, v_map;  // tma: the caches as 4-D tensors (dims, heads, slots, blocks)
  AttnParams a;
  int gchunks;      // CTAs per KV head: ceil(group / (8 * head_tiles))
  int head_tiles;   // 8-head column tiles per CTA: 1 (group <= 8) or 2
  int stages;       // copy ring depth of each warp (<= kBulkMaxStages)
  int tma;          // 1: tensor copies, 0: row copies
  int row_bytes;    // one key's K (or V) row: head_size * element size
  int row_stride;   // bytes between staged rows: 128 (tma) or row_bytes + 16
  int box_bytes;    // bytes between 128-byte column slices: 2048 (tma) or 128
  int swz;          // 7 (tma: 128-byte swizzle) or 0
  int v_off;        // bytes from a stage's K rows to its V rows
  int stage_bytes;  // one ring stage (a multiple of 1024 with tma: the swizzle's alignment)
  int warp_bytes;   // a warp's shared memory (its ring; later its fp32 output for the merge)
  int q_bytes;      // the 16-bit query tile, [8 * head_tiles][head_size + 8]
  int heads_first;  // 1: grid (heads x chunks, seqs, parts), a sequence's KV heads launch together
  int resident;     // CTAs per SM the rings are sized for
  uint64_t* timeline;  // profiling builds: per-CTA stamps (decode_timeline.h), else nullptr
};

constexpr int kBulkMaxStages = 8;

// Early release: a chunk's K and V fragments move to registers before its math and its stage is
// refilled at once, so the next copy waits for the copy engine, not for the math too (H100: 5-6 %
// faster at batch 1, within noise on the bandwidth-bound shapes). Where the fragments fit: head
// sizes up to 128 with one 8-head column tile.
constexpr bool bulk_early_release(int head_size, int head_tiles) {
  return head_size * head_tiles <= 128;
}

// Floats between the rows of a warp's [8 * head_tiles][head_size] fp32 output in its ring at the
// final merge: padded by 4 so that the rows of heads 2q (q = 0..3), written by one store, fall in
// different shared-memory banks, and rows stay 16-byte aligned for the merge's vector loads.
constexpr int bulk_out_pitch(int head_size) { return head_size + 4; }

// CTAs of 128 threads per SM that the kernel's registers are capped for (__launch_bounds__): 4 at
// 128 registers up to head size 128 with one column tile, except 16-bit caches of head size 112
// and 128, whose early-release fragments need 150-165 registers: 3 (the rings are sized for no
// more).
constexpr int bulk_min_ctas(bool fp8, int head_size, int head_tiles) {
  return head_size * head_tiles <= 128   ? (fp8 || head_size <= 96 ? 4 : 3)
         : head_size * head_tiles <= 256 ? 2
                                         : 1;
}

// nullptr when the Hopper decode covers the call, else why not. It covers: a compute capability
// 9.x device with the kernel compiled for it, fp16/bf16 queries, head size a multiple of 16 (of 32
// for fp8 caches) up to 256, key and value caches in row layouts (NHD, or any layout whose
// (slot, head) rows are contiguous and 16-byte aligned).
// vec16: both caches' rows can be moved as 16-byte vectors (vector_ok(cache, 16)).
const char* decode_bulk_uncovered(const AttnParams& p, DType qdtype, KVCacheDType cache,
                                  bool vec16);

// For a call decode_bulk_uncovered accepts: the CTAs of one sequence (or balanced work item), KV
// heads x head chunks, and in *resident the CTAs per SM the shared-memory rings are sized for.
int decode_bulk_item_ctas(const AttnParams& p, KVCacheDType cache, int* resident);

// Launches on `s`; p.partition_size > 0 selects split mode (v2 partial results).
void launch_decode_bulk(const AttnParams& p, DType qdtype, KVCacheDType cache, cudaStream_t s);

// Per query dtype (decode_bulk_{f16,bf16}.cu).
void launch_decode_bulk_f16(const BulkDecodeParams& p, int cache_fp8, dim3 grid, int smem,
                            cudaStream_t s);
void launch_decode_bulk_bf16(const BulkDecodeParams& p, int cache_fp8, dim3 grid, int smem,
                             cudaStream_t s);
// The SASS architecture the bulk kernels were built for on the current device (e.g. 90); below
// 90 they are compiled-out stubs.
int decode_bulk_binary_version();

}  // namespace pagedkv::cuda_ops
