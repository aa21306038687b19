// Which query tile each CTA of the tensor-core prefill kernels serves (prefill_mma_kernel.cuh,
// prefill_wgmma_kernel.cuh). The grid is ranks x pairs CTAs: every (sequence, KV head) pair gets
// `ranks` CTAs, rank 0 being the sequence's last query tile (the longest causal key range).
//
// CTAs walk the pairs `pair_chunk` at a time and, inside a chunk, every rank of its pairs longest
// first. All query tiles of a pair read the same keys and values, so the chunk bounds the K/V
// bytes the CTAs running at one time share through L2. Interleaving every pair (the order before,
// pair_chunk = pairs) left 32 x 512 tokens at a 37 % L2 hit rate on the H100, re-reading K/V from
// DRAM at 61 % of its bandwidth; FlashAttention walks one (batch, head) at a time.
#pragma once

#include <algorithm>

#include "ops/cuda/attention_params.h"
#include "ops/cuda/device_props.h"

namespace pagedkv::cuda_ops::prefill {

struct TileSlot {
  int pair, rank;  // pair = seq * num_kv_heads + kv head; rank 0 = the sequence's last tile
};

__device__ __forceinline__ TileSlot tile_slot(int cta, int pairs, int ranks, int pair_chunk) {
  const int per_chunk = pair_chunk * ranks;  // CTAs of a full chunk
  const int chunk = cta / per_chunk, first = chunk * pair_chunk;
  const int in_chunk = min(pair_chunk, pairs - first);  // the last chunk may be short
  const int off = cta - chunk * per_chunk;
  return {first + off % in_chunk, off / in_chunk};
}

// The chunk for a launch of `ranks` CTAs per pair: PAGEDKV_PREFILL_PAIR_CHUNK when set (0: every
// pair at once, the old order), else one pair at a time like FlashAttention.
inline int pair_chunk(const AttnParams& p) {
  const int pairs = p.num_seqs * p.num_kv_heads;
  const int chunk = env_int("PAGEDKV_PREFILL_PAIR_CHUNK", 1);
  return chunk <= 0 ? pairs : std::min(chunk, pairs);
}

// The CTA's (sequence, KV head) pair and rank under the launch's order (gridDim.x = ranks x pairs).
__device__ __forceinline__ TileSlot tile_slot(const AttnParams& p) {
  const int pairs = p.num_seqs * p.num_kv_heads;
  return tile_slot(blockIdx.x, pairs, gridDim.x / pairs, p.pair_chunk);
}

}  // namespace pagedkv::cuda_ops::prefill
