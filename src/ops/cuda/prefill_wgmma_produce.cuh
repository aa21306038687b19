// Producer warpgroup of the Hopper wgmma prefill kernel (prefill_wgmma_kernel.cuh): streams every
// K/V tile of the CTA into the stages, kStages ahead of the slower consumer.
//
// A tile of BN keys is BN / 16 groups of 16 keys. A lane of the warpgroup's first warp (K) or
// second warp (V) per group and slice copies a group that lies entirely in the cached context (one
// block-table lookup, then one TMA box of 16 slots per 128-byte slice of the head dimension: 2
// copies for head size 128) or entirely in the sequence's new tokens (one box of 16 token rows per
// slice) straight into the 128-byte swizzled layout wgmma reads (16-byte unit u of row r at unit u
// ^ (r % 8); each box lands 2048-byte aligned). The group that holds the context's end (when it is
// not a multiple of 16), the groups at and past the sequence's end, and every group a missing map
// cannot serve, go through cp.async by all 128 threads, which writes zeros past the CTA's last key:
// a box there would read the next sequence's rows, and causality gives them P = 0, but 0 * inf is
// NaN.
//
// A tile entirely in the sequence's new tokens goes in boxes of tile_rows tokens instead (2
// copies per half for head size 128 with whole-tile boxes), and a cached block of 32, 64 or 128
// slots that lies whole in the tile and in the context in one box per slice (block_rows): the
// TMA's cost is per box.
//
// An fp8 cache's boxes land bytes, not the query dtype wgmma reads. With maps (raw_tma) a lane
// per group copies the 16 rows unswizzled into the group's own place in the stage, on a "raw"
// mbarrier of the stage half, and one tile later, once they landed, the producer warps
// or the consumers (WgParams::consumer_dequant) dequantise them in place (prefill_wgmma_fp8.cuh):
// the copies of the next tile are in flight meanwhile. The
// group that holds the context's end, and every cached group without maps, pass through the
// threads' registers (load_groups_fp8); new-token groups go as above.
//
// Each stage half ("full" K, "full" V) completes when thread 0 (K) or 32 (V) arrived with the
// TMA bytes of all the half's boxes and all 128 threads' cp.async landed
// (cp.async.mbarrier.arrive.noinc; with an fp8 cache, which adds plain stores, each thread waits
// for its cp.async and arrives with a release): 129 arrivals.
#pragma once

#include "ops/cuda/bulk_copy.cuh"
#include "ops/cuda/prefill_wgmma.h"
#include "ops/cuda/prefill_wgmma_fp8.cuh"
#include "ops/cuda/prefill_wgmma_tile.cuh"

namespace pagedkv::cuda_ops::prefill_wg {

#if PAGEDKV_WGMMA_ENABLED

constexpr int kFullArrivals = 129;

// The cache block holding key `key` of the CTA's sequence (block-table row bt) and its slot
// there; an id outside the cache reads block 0, never wild memory.
__device__ __forceinline__ int cached_block(const AttnParams& p, const int* bt, int key,
                                            int& slot) {
  const int bi = p.bs_shift >= 0 ? key >> p.bs_shift : key / p.block_size;
  slot = key - bi * p.block_size;
  const int b = bt[min(bi, p.max_blocks - 1)];
  return unsigned(b) < unsigned(p.num_blocks) ? b : 0;
}

// Whether the group of keys [key0, key0 + 16) goes through a tensor map.
__device__ __forceinline__ bool tma_group(const WgParams& wp, int key0, const CtaWork& w) {
  return key0 + 16 <= w.ctx ? wp.cache_tma != 0
                            : key0 >= w.ctx && key0 + 16 <= w.kv_end && wp.new_tma != 0;
}

// The groups of tile kt that no map serves, with an fp8 cache: every cached chunk's 8 bytes are
// loaded first, for all groups at once (one load latency per tile half, not one per group), then
// dequantised with `scale` and stored into the swizzled layout; new-token chunks and the zeros
// past k_hi go by cp.async as in load_group.
template <typename T, int DP>
__device__ __forceinline__ void load_groups_fp8(uint32_t dst, const uint8_t* cache,
                                                const CacheLayout& cl, float scale, const T* fresh,
                                                const CacheLayout& fl, const WgParams& wp,
                                                const int* bt, int kt, const CtaWork& w, int ptid) {
  using C = Tile<DP>;
  const AttnParams& p = wp.a;
  // Chunks per thread and group; groups per batch of loads, so that a batch's bytes fit the
  // producer's 72 registers (kProducerRegs) without spilling next to the tile in flight.
  constexpr int kPer = 16 * C::CH / 128, kBatch = 4 / kPer;
  static_assert(16 * C::CH % 128 == 0 && C::BN / 16 % kBatch == 0);
#pragma unroll 1
  for (int g0 = 0; g0 < C::BN / 16; g0 += kBatch) {
    uint2 raw[kBatch][kPer];
#pragma unroll
    for (int g = 0; g < kBatch; ++g) {
      const int gk = kt + 16 * (g0 + g);
      const bool mapped = tma_group(wp, gk, w) || raw_group(wp, gk, w);
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int idx = ptid + 128 * i, j = idx / C::CH, c = idx % C::CH;
        const int key = kt + 16 * (g0 + g) + j;
        raw[g][i] = make_uint2(0u, 0u);
        if (!mapped && key < w.ctx) {
          int slot;
          const int64_t block = cached_block(p, bt, key, slot);
          raw[g][i] = *reinterpret_cast<const uint2*>(cache + cl.offset(block, slot, w.kvh, c * 8));
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kBatch; ++g) {
      const int gk = kt + 16 * (g0 + g);
      if (tma_group(wp, gk, w) || raw_group(wp, gk, w)) continue;  // uniform over the warpgroup
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int idx = ptid + 128 * i, j = idx / C::CH, c = idx % C::CH;
        const int key = kt + 16 * (g0 + g) + j;
        const uint32_t at = dst + wgmma::sw128(16 * (g0 + g) + j, c, C::BN);
        if (key < w.ctx) {
          const uint8_t* b8 = reinterpret_cast<const uint8_t*>(&raw[g][i]);
          alignas(16) T v[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            v[e] = from_float<T>(fp8_to_float(b8[e], wp.vf.cache_fp8) * scale);
          }
          const uint32_t* u = reinterpret_cast<const uint32_t*>(v);
          asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(at), "r"(u[0]), "r"(u[1]),
                       "r"(u[2]), "r"(u[3])
                       : "memory");
        } else {
          const bool live = key < w.k_hi;
          const T* src =
              live ? fresh + fl.offset(int64_t(w.qs) + (key - w.ctx), 0, w.kvh, c * 8) : fresh;
          cp_async16_zfill(at, src, live ? 16 : 0);
        }
      }
    }
  }
}

// The TMA boxes of one half (keys or values) of tile kt into the stage half at `tile`: whole-tile
// boxes of new tokens, or per group one box per 128-byte slice (cached groups through the cache
// maps of a 16-bit cache, new-token groups through the new-token maps).
template <typename T, int DP>
__device__ __forceinline__ void issue_boxes(const WgParams& wp, bool is_v, unsigned char* tile,
                                            uint64_t* full, const int* bt, int kt, const CtaWork& w,
                                            int ptid) {
  using C = Tile<DP>;
  const AttnParams& p = wp.a;
  constexpr int kGroupBytes = 16 * DP * int(sizeof(T));
  // All of the tile in the sequence's new tokens: whole-tile boxes (tma_group holds for each
  // of its groups, so none is left to the threads).
  const bool whole = wp.tile_rows > 0 && kt >= w.ctx && kt + C::BN <= w.kv_end;
  // The producer's first warp issues the K boxes, its second the V boxes: two instruction
  // streams. lt: this thread's lane in that warp.
  const int lt = ptid - (is_v ? 32 : 0);
  constexpr int kSlices = DP / 64;  // 128-byte slices of a row: boxes per 16-key group
  if (whole && lt == 0) {
    mbar_arrive_expect(full, C::BN * DP * int(sizeof(T)));
    const void* map = is_v ? &wp.v_tile_map : &wp.k_tile_map;
    const int tok = w.qs + (kt - w.ctx);
    for (int r = 0; r < C::BN; r += wp.tile_rows) {
#pragma unroll
      for (int cb = 0; cb < DP / 64; ++cb) {
        tma_load_3d(tile + cb * C::BN * 128 + r * 128, map, cb * 64, w.kvh, tok + r, full, 0,
                    false);
      }
    }
  } else if (!whole && lt >= 0 && lt < C::BN / 16 * kSlices) {
    // Lane g * kSlices + cb issues slice cb of group g (lane 0 also announces the bytes of all
    // of them; a copy completing before that is fine: the phase also waits for lane 0's
    // arrival). One thread issuing every group's boxes after its block-table load was the slow
    // part of a tile over a cached prefix.
    if (lt == 0) {
      int groups = 0;
#pragma unroll
      for (int g = 0; g < C::BN / 16; ++g) groups += tma_group(wp, kt + 16 * g, w);
      mbar_arrive_expect(full, groups * kGroupBytes);
    }
    const int g = lt / kSlices, cb = lt % kSlices, key0 = kt + 16 * g;
    if (tma_group(wp, key0, w)) {
      const void* cmap = is_v ? &wp.v_cache_map : &wp.k_cache_map;
      const void* nmap = is_v ? &wp.v_new_map : &wp.k_new_map;
      unsigned char* gdst = tile + g * 16 * 128;  // rows 16g.. of every 64-column block
      if (key0 < w.ctx) {
        int slot;  // a multiple of 16: the box stays in the block
        const int block = cached_block(p, bt, key0, slot);
        // A block that lies whole in this tile and in the context: its first group's lane copies
        // all of it in one box (the bytes are those of its groups, announced above).
        const int start = key0 - slot;
        if (wp.block_rows > 0 && start >= kt && start + wp.block_rows <= min(w.ctx, kt + C::BN)) {
          if (slot == 0) {
            tma_load_4d(gdst + cb * C::BN * 128, is_v ? &wp.v_block_map : &wp.k_block_map, cb * 64,
                        w.kvh, 0, block, full, 0, false);
          }
        } else {
          tma_load_4d(gdst + cb * C::BN * 128, cmap, cb * 64, w.kvh, slot, block, full, 0, false);
        }
      } else {
        const int tok = w.qs + (key0 - w.ctx);
        tma_load_3d(gdst + cb * C::BN * 128, nmap, cb * 64, w.kvh, tok, full, 0, false);
      }
    }
  }
}

// One half of tile kt with a 16-bit cache: its boxes, then cp.async for the groups no map serves.
template <typename T, int DP>
__device__ __forceinline__ void load_half(const WgParams& wp, bool is_v, unsigned char* tile,
                                          uint64_t* full, const int* bt, int kt, const CtaWork& w,
                                          int ptid) {
  using C = Tile<DP>;
  const AttnParams& p = wp.a;
  const uint32_t dst = smem_addr(tile);
  issue_boxes<T, DP>(wp, is_v, tile, full, bt, kt, w, ptid);
  const T* cache = static_cast<const T*>(is_v ? p.v_cache : p.k_cache);
  const T* fresh = static_cast<const T*>(is_v ? p.v_new : p.k_new);
  const CacheLayout& cl = is_v ? p.vl : p.kl;
  const CacheLayout& fl = is_v ? p.vnl : p.knl;
#pragma unroll 1
  for (int g = 0; g < C::BN / 16; ++g) {
    const int key0 = kt + 16 * g;
    if (tma_group(wp, key0, w)) continue;  // uniform over the warpgroup
    load_group<T, DP>(dst, cache, cl, fresh, fl, p, bt, key0, 16 * g, w.k_hi, w.ctx, w.qs, w.kvh,
                      ptid);
  }
  wgmma::mbar_arrive_cp_async(full);  // after this thread's cp.async (none: at once)
}

// fp8 cache with maps: the raw boxes of one half of tile kt, one lane per group of the first
// (K) or second (V) producer warp, on the stage half's "raw" mbarrier (whose phase completes
// with no bytes when the tile has no raw group).
template <int DP>
__device__ __forceinline__ void issue_raw(const WgParams& wp, bool is_v, unsigned char* tile,
                                          uint64_t* raw, const int* bt, int kt, const CtaWork& w,
                                          int ptid) {
  using C = Tile<DP>;
  const AttnParams& p = wp.a;
  const int lt = ptid - (is_v ? 32 : 0);
  if (lt < 0 || lt >= C::BN / 16) return;
  if (lt == 0) {
    int groups = 0;
#pragma unroll
    for (int g = 0; g < C::BN / 16; ++g) groups += raw_group(wp, kt + 16 * g, w);
    mbar_arrive_expect(raw, groups * 16 * DP);
  }
  const int key0 = kt + 16 * lt;
  if (!raw_group(wp, key0, w)) return;
  int slot;  // a multiple of 16: the box stays in the block
  const int block = cached_block(p, bt, key0, slot);
  tma_load_4d(tile + raw_offset<DP>(lt), is_v ? &wp.v_cache_map : &wp.k_cache_map, 0, w.kvh, slot,
              block, raw, 0, false);
}

// fp8 cache: the boxes of one half of tile kt (new tokens; with maps, the raw cached groups).
template <typename T, int DP>
__device__ __forceinline__ void issue_half_fp8(const WgParams& wp, bool is_v, unsigned char* tile,
                                               uint64_t* full, uint64_t* raw, const int* bt, int kt,
                                               const CtaWork& w, int ptid) {
  issue_boxes<T, DP>(wp, is_v, tile, full, bt, kt, w, ptid);
  if (wp.raw_tma) issue_raw<DP>(wp, is_v, tile, raw, bt, kt, w, ptid);
}

// fp8 cache: completes one half of tile kt, issued earlier: the groups through registers and
// cp.async, the raw groups dequantised once landed (raw phase `parity`) unless the consumers do
// it (`dequant` false), then this thread's arrival on `full`.
template <typename T, int DP>
__device__ __forceinline__ void finish_half_fp8(const WgParams& wp, bool is_v, bool dequant,
                                                unsigned char* tile, uint64_t* full, uint64_t* raw,
                                                uint32_t parity, const int* bt, int kt,
                                                const CtaWork& w, int ptid) {
  using C = Tile<DP>;
  const AttnParams& p = wp.a;
  const float scale = is_v ? p.v_scale.get() : p.k_scale.get();
  // Whether some group of the tile is left to the threads (warpgroup-uniform): mostly the
  // sequence's last tiles.
  bool rest = false;
#pragma unroll
  for (int g = 0; g < C::BN / 16; ++g) {
    rest |= !tma_group(wp, kt + 16 * g, w) && !raw_group(wp, kt + 16 * g, w);
  }
  if (rest) {
    load_groups_fp8<T, DP>(
        smem_addr(tile), static_cast<const uint8_t*>(is_v ? p.v_cache : p.k_cache),
        is_v ? p.vl : p.kl, scale, static_cast<const T*>(is_v ? p.v_new : p.k_new),
        is_v ? p.vnl : p.knl, wp, bt, kt, w, ptid);
  }
  if (wp.raw_tma && dequant) {
    wgmma::mbar_wait(raw, parity);
    dequant_raw<T, DP>(wp, tile, scale, kt, w, ptid);
  }
  // Plain stores too: wait for this thread's cp.async, order the stores before later tensor
  // copies into this stage, then arrive with release semantics (the consumers' wait acquires;
  // their proxy fence hands the bytes to wgmma).
  if (rest) cp_async_wait_all();
  wgmma::fence_proxy_async();
  wgmma::mbar_arrive(full);
}

// Producer warpgroup: every K/V tile of the CTA. With an fp8 cache a tile's boxes are issued
// before the previous tile is finished (finish_half_fp8 waits for its raw bytes).
template <typename T, int DP, bool kFp8>
__device__ __forceinline__ void produce(const WgParams& wp, const CtaWork& w, unsigned char* smem,
                                        uint64_t* bars) {
  using C = Tile<DP>;
  uint64_t *full_k = bars, *full_v = bars + C::kStages, *empty = bars + 2 * C::kStages;
  uint64_t *raw_k = bars + C::kRawBar, *raw_v = raw_k + C::kStages;
  const int ptid = threadIdx.x - 256;
  const int* bt = wp.a.block_tables + int64_t(w.seq) * wp.a.bt_stride;
  if (wp.q_tma && ptid == 0) {  // the query tile first: the consumers start with it
    uint64_t* q_full = bars + C::kQBar;
    mbar_arrive_expect(q_full, C::BM * DP * 2);
    const int group = wp.a.group, tok = w.qs + w.r0 / group;
#pragma unroll
    for (int cb = 0; cb < DP / 64; ++cb) {
      tma_load_3d(smem + cb * C::BM * 128, &wp.q_map, cb * 64, w.kvh * group, tok, q_full, 0,
                  false);
    }
  }
  auto k_tile = [&](int stage) { return smem + C::kKOff + stage * C::kKVBytes; };
  auto v_tile = [&](int stage) { return smem + C::kVOff + stage * C::kKVBytes; };
  // fp8: completes tile `it` (stage it % kStages, its (it / kStages)-th use of the stage).
  auto finish = [&](int it) {
    const int stage = it % C::kStages, kt = w.k_lo + it * C::BN;
    const uint32_t parity = (it / C::kStages) & 1;
    finish_half_fp8<T, DP>(wp, false, wp.consumer_dequant < 2, k_tile(stage), &full_k[stage],
                           &raw_k[stage], parity, bt, kt, w, ptid);
    finish_half_fp8<T, DP>(wp, true, wp.consumer_dequant < 1, v_tile(stage), &full_v[stage],
                           &raw_v[stage], parity, bt, kt, w, ptid);
  };
  for (int it = 0; it < w.n_tiles; ++it) {
    const int stage = it % C::kStages, kt = w.k_lo + it * C::BN;
    if (it >= C::kStages) wgmma::mbar_wait(&empty[stage], (it / C::kStages - 1) & 1);
    if constexpr (kFp8) {
      issue_half_fp8<T, DP>(wp, false, k_tile(stage), &full_k[stage], &raw_k[stage], bt, kt, w,
                            ptid);
      issue_half_fp8<T, DP>(wp, true, v_tile(stage), &full_v[stage], &raw_v[stage], bt, kt, w,
                            ptid);
      if (it > 0) finish(it - 1);
    } else {
      load_half<T, DP>(wp, false, smem + C::kKOff + stage * C::kKVBytes, &full_k[stage], bt, kt, w,
                       ptid);
      load_half<T, DP>(wp, true, smem + C::kVOff + stage * C::kKVBytes, &full_v[stage], bt, kt, w,
                       ptid);
    }
  }
  if constexpr (kFp8) {
    if (w.n_tiles > 0) finish(w.n_tiles - 1);
  }
  cp_async_wait_all();  // nothing in flight when the thread exits
}

#endif  // PAGEDKV_WGMMA_ENABLED

}  // namespace pagedkv::cuda_ops::prefill_wg
