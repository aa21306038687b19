// Tile geometry and shared-memory loads of the Hopper wgmma prefill kernel
// (prefill_wgmma_kernel.cuh). All tiles are stored 128-byte swizzled as [DP / 64][rows][64]
// (wgmma.cuh: sw128), the layout wgmma reads through its matrix descriptors.
#pragma once

#include "ops/cuda/attention_params.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/prefill_order.cuh"
#include "ops/cuda/prefill_tile.cuh"
#include "ops/cuda/prefill_wgmma.h"
#include "ops/cuda/wgmma.cuh"

namespace pagedkv::cuda_ops::prefill_wg {

// A CTA is 2 consumer warpgroups of 64 query rows each (BM = 128 rows: (token, query head of the
// group) pairs like the mma.sync kernel) and 1 producer warpgroup that streams K/V tiles of BN
// keys through kStages shared-memory stages (TMA tensor copies, cp.async where a map cannot
// serve: prefill_wgmma_produce.cuh), handing them over with mbarriers. Three stages for head
// size 128: 32 KB of Q + 3 x 64 KB of K/V + barriers + 1 KB of alignment slack = 230,528 bytes,
// under the 232,448 (227 KB) one CTA may use.
// Registers are rebalanced with setmaxnreg (the launch gives 168 each): the producer only computes
// addresses; ptxas keeps the consumer code within 216 and the producer within 72 without spills.
template <int DP>
struct Tile {
  static_assert(DP == 64 || DP == 128, "head sizes 64 and 128");
  static constexpr int kConsumers = 2, kThreads = 128 * (kConsumers + 1);
  static constexpr int kProducerRegs = 72, kConsumerRegs = 216;  // 128*72 + 256*216 <= 64K
  static constexpr int BM = kTileRows, BN = kTileKeys, CH = DP / 8;
  static_assert(BM == 64 * kConsumers, "a consumer warpgroup per 64 query rows");
  static constexpr int kStages = DP == 128 ? 3 : 4;
  static constexpr int kQBytes = BM * DP * 2, kKVBytes = BN * DP * 2;
  static constexpr int kKOff = kQBytes, kVOff = kKOff + kStages * kKVBytes;
  // Barriers: full_k, full_v, empty per stage, the query tile's, then raw_k, raw_v per stage (an
  // fp8 cache's bytes landed: prefill_wgmma_produce.cuh).
  static constexpr int kBarOff = kVOff + kStages * kKVBytes, kQBar = 3 * kStages;
  static constexpr int kRawBar = kQBar + 1;
  static constexpr int kSmem = kBarOff + (kRawBar + 2 * kStages) * 8 + 1024;  // + alignment slack
  static_assert(kSmem <= 227 * 1024, "one CTA's shared memory on sm_90");
  static_assert(kKOff % 1024 == 0 && kKVBytes % 1024 == 0, "TMA swizzle atoms 1024-aligned");
};

// Where this CTA's work lies: sequence, KV head, first packed row and the key range.
struct CtaWork {
  int seq, kvh, qs, rows, r0, ctx, k_lo, k_hi, n_tiles;
  int kv_end;  // keys of the sequence: ctx + its new tokens
};

template <int BM, int BN>
__device__ __forceinline__ bool cta_work(const AttnParams& p, CtaWork& w) {
  const prefill::TileSlot slot = prefill::tile_slot(p);
  const int rank = slot.rank;
  w.seq = slot.pair / p.num_kv_heads;
  w.kvh = slot.pair % p.num_kv_heads;
  w.qs = min(max(p.query_start_loc[w.seq], 0), p.num_q);               // bad metadata: no wild
  const int qlen = min(p.query_start_loc[w.seq + 1], p.num_q) - w.qs;  // reads or writes
  w.rows = qlen * p.group;
  const int tile = (w.rows + BM - 1) / BM - 1 - rank;  // rank 0 = the sequence's last tile
  if (tile < 0) return false;
  w.r0 = tile * BM;
  w.ctx = p.seq_lens[w.seq] - qlen;
  w.kv_end = w.ctx + qlen;
  w.k_hi = p.causal ? w.ctx + (min(w.r0 + BM, w.rows) - 1) / p.group + 1 : w.kv_end;
  // Tiles start on a multiple of 16 keys so that 16-key copy groups never straddle a cache block
  // (block sizes are multiples of 16 for the cache maps); keys before the window are masked.
  w.k_lo = p.window > 0 ? max(0, w.ctx + w.r0 / p.group - p.window + 1) & ~15 : 0;
  w.n_tiles = w.k_hi > w.k_lo ? (w.k_hi - w.k_lo + BN - 1) / BN : 0;
  return true;
}

// cp.async of 16 bytes; src_bytes = 0 writes zeros without reading (src must still be a valid
// address). Zeros go through cp.async too, so one cp.async.mbarrier.arrive covers every write.
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

// Waits for every cp.async of this thread, committed to a group or not (the loads here are
// tracked by mbarriers, not by groups).
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// Producer warpgroup, one 16-key group with cp.async: keys [key0, key0 + 16) of KV head `kvh`
// into rows [row0, row0 + 16) of the swizzled tile at shared address dst: the cached context from
// the paged cache, the new tokens (positions >= ctx) from `fresh` (token qs + key - ctx), zeros
// from k_hi on (their P is 0, and 0 * garbage could be NaN). Consecutive threads cover one row's
// 16-byte chunks (coalesced reads, conflict-free swizzled writes). ptid: 0..127.
template <typename T, int DP>
__device__ __forceinline__ void load_group(uint32_t dst, const T* cache, const CacheLayout& cl,
                                           const T* fresh, const CacheLayout& fl,
                                           const AttnParams& p, const int* bt, int key0, int row0,
                                           int k_hi, int ctx, int qs, int kvh, int ptid) {
  using C = Tile<DP>;
#pragma unroll
  for (int idx = ptid; idx < 16 * C::CH; idx += 128) {
    const int j = idx / C::CH, c = idx % C::CH, key = key0 + j;
    const T* src = fresh;
    if (key < ctx) {
      const int bi = p.bs_shift >= 0 ? key >> p.bs_shift : key / p.block_size;
      const int slot = key - bi * p.block_size;
      const int b = bt[min(bi, p.max_blocks - 1)];
      const int64_t block = unsigned(b) < unsigned(p.num_blocks) ? b : 0;  // no wild reads
      src = cache + cl.offset(block, slot, kvh, c * 8);
    } else if (key < k_hi) {
      src = fresh + fl.offset(int64_t(qs) + (key - ctx), 0, kvh, c * 8);
    }
    cp_async16_zfill(dst + wgmma::sw128(row0 + j, c, C::BN), src, key < k_hi ? 16 : 0);
  }
}

// Consumer warpgroup: its 64 query rows [wr0, wr0 + 64) into its slice of the swizzled Q tile
// (sQ: the CTA's tile, rows wr0 - r0 ...); zeros for rows past the sequence. wtid: 0..127.
template <typename T, int DP>
__device__ __forceinline__ void load_q(uint32_t sQ, const AttnParams& p, bool vec, int qs, int rows,
                                       int r0, int wr0, int kvh, int wtid) {
  using C = Tile<DP>;
  const T* q = static_cast<const T*>(p.q);
  for (int idx = wtid; idx < 64 * C::CH; idx += 128) {
    const int r = wr0 - r0 + idx / C::CH, c = idx % C::CH, gr = r0 + r;
    const uint32_t dst = sQ + wgmma::sw128(r, c, C::BM);
    const T* src = q + int64_t(qs + gr / p.group) * p.q_s_tok +
                   int64_t(kvh * p.group + gr % p.group) * p.q_s_head + c * 8;
    if (gr >= rows) {
      cp_async16_zfill(dst, q, 0);
    } else if (vec) {
      cp_async16_zfill(dst, src, 16);
    } else {
      alignas(16) T v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = src[i];
      asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(dst),
                   "r"(reinterpret_cast<uint32_t*>(v)[0]), "r"(reinterpret_cast<uint32_t*>(v)[1]),
                   "r"(reinterpret_cast<uint32_t*>(v)[2]), "r"(reinterpret_cast<uint32_t*>(v)[3])
                   : "memory");
    }
  }
}

}  // namespace pagedkv::cuda_ops::prefill_wg
