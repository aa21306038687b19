// Hopper wgmma prefill kernel (prefill_wgmma_kernel.cuh): fp16/bf16 queries with a cache in the
// query dtype or in fp8 (dequantised into the tiles; fp8 is a separate instantiation: its run-time
// twin slowed the 16-bit kernel by 5-10 %, benchmarks/RESULTS.md), whose K/V rows (cache and new
// tokens) allow 16-byte (fp8: 8-byte) loads, head sizes 64 and 128, every mask / soft-cap / alibi
// / window option of the mma.sync kernel. It serves the calls it covers on compute capability 9.x
// devices with sm_90a code (AttentionKernel::kHopper of context_attention_fwd).
#pragma once

#include <cuda.h>  // CUtensorMap (a plain struct; the driver is reached at run time)

#include "ops/cuda/attention_params.h"
#include "ops/cuda/prefill_mma.h"

namespace pagedkv::cuda_ops {

// nullptr when the kernel covers this call on the current device, else why not.
const char* prefill_wgmma_uncovered(const AttnParams& p, DType qdtype, KVCacheDType cache);
void launch_prefill_wgmma(const AttnParams& p, DType qdtype, KVCacheDType cache, int max_query_len,
                          cudaStream_t s);

namespace prefill_wg {

// The kernel's parameters (a __grid_constant__ argument: the maps must stay in parameter space,
// 64-byte aligned). Key tiles are copied in groups of 16 keys; a group entirely in the cached
// context uses the cache maps when cache_tma, one entirely in the sequence's new tokens the
// new-token maps when new_tma (a tile entirely in them: tile_rows-token boxes when tile_rows > 0,
// i.e. 2 copies per tile half for head size 128 instead of 16); every other group (the ones
// holding the context's or the sequence's end, those past it, or all of them when a map is
// missing) is copied with cp.async by the producer warpgroup's threads; with an fp8 cache
// (vf.cache_fp8) there are no cache maps, and those threads load the context's bytes and store
// them dequantised. The query tile goes through
// q_map (boxes of BM / group tokens x the group's heads: the rows land in the kernel's packed
// (token, head) order) when the group size divides BM, else the consumers load it with cp.async;
// a consumer warpgroup's 64 output rows go out through o_map when they all lie in the sequence and
// the group size divides 64, else by its threads' stores.
struct WgParams {
  CUtensorMap k_cache_map, v_cache_map;  // cache_tma: (dims, heads, slots, blocks), 16-slot boxes
  CUtensorMap k_new_map, v_new_map;      // new_tma: (dims, heads, tokens), 16-token boxes
  CUtensorMap k_tile_map, v_tile_map;    // tile_rows > 0: the same with tile_rows-token boxes
  CUtensorMap k_block_map, v_block_map;  // block_rows > 0: the cache maps, whole-block boxes
  CUtensorMap q_map;                     // q_tma: (dims, heads, tokens), a query tile per box
  CUtensorMap o_map;                     // o_tma: the output, half a query tile per box
  AttnParams a;
  prefill::VecFlags vf;
  int cache_tma, new_tma, q_tma, o_tma;
  int tile_rows;   // 0, or boxes of that many new tokens (a divisor of the key tile, >= 32)
  int block_rows;  // 0, or the block size (32, 64, 128): a cached block that lies whole in a
                   // key tile and in the context goes in one box per slice
  int raw_tma;     // fp8 cache: k/v_cache_map copy 16-slot boxes of its bytes unswizzled into the
                   // stage, which are dequantised in place (prefill_wgmma_fp8.cuh)
  int consumer_dequant;  // raw_tma: who dequantises the raw groups: 1 the consumers V and the
                         // producer K (head size 128), 2 the consumers both (64); 0 without
                         // raw_tma (prefill_wgmma.cu)
};

constexpr int kTileKeys = 128;  // keys per K/V tile (Tile<DP>::BN)
constexpr int kTileRows = 128;  // packed (token, head) query rows per CTA (Tile<DP>::BM)

// Per query dtype (prefill_wgmma_f16.cu, prefill_wgmma_bf16.cu).
void launch_f16(const WgParams& wp, int max_query_len, cudaStream_t s);
void launch_bf16(const WgParams& wp, int max_query_len, cudaStream_t s);
// Whether the build carries sm_90a code for this device (a build for plain "90" has none: wgmma
// needs the architecture-specific target).
bool has_sm90a_code();

}  // namespace prefill_wg
}  // namespace pagedkv::cuda_ops
