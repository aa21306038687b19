// Tile geometry and shared-memory loads of the tensor-core prefill kernel (prefill_mma_kernel.cuh).
#pragma once

#include "ops/cuda/attention_params.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/mma.cuh"

namespace pagedkv::cuda_ops::prefill {

// A CTA of 4 warps owns BM query rows; each warp owns MT m16 tiles (32 rows when the 32-row
// accumulators fit in registers, i.e. head size <= 128), so every K/V fragment that ldmatrix brings
// in feeds 2 * MT mma: with 16 rows per warp the loop is bound by shared-memory reads, with 32 by
// the tensor cores. K/V tiles of BN keys are double-buffered; rows are padded by 16 bytes so the 8
// rows an ldmatrix reads land in distinct banks.
template <int DP>
struct Tile {
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int MT = DP <= 128 ? 2 : 1;
  static constexpr int BM = kWarps * 16 * MT;
  static constexpr int BN = DP <= 128 ? 64 : 32;
  static constexpr int LD = DP + 8;
  static constexpr int CH = DP / 8;                     // 16-byte chunks per row
  static constexpr int kSmem = (BM + 4 * BN) * LD * 2;  // Q + 2 stages of K and V
};

// Elements d0..d0+7 of row (block, slot, head) into shared memory: one cp.async when the run is
// 16-byte aligned and contiguous, else eight scalar reads (vLLM's value layout strides along d).
template <typename T>
__device__ __forceinline__ void copy8(T* dst, const T* base, const CacheLayout& l, bool vec,
                                      int64_t block, int slot, int head, int d0) {
  if (vec) {
    cp_async16(dst, base + l.offset(block, slot, head, d0));
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) dst[i] = base[l.offset(block, slot, head, d0 + i)];
  }
}

// Elements d0..d0+7 of row (block, slot, head) of an fp8 cache (`kind`), dequantised (x scale)
// into T in shared memory: one 8-byte load when `vec` (8-byte aligned runs), else eight byte
// loads. A synchronous load, unlike copy8's cp.async: the bytes must pass through registers.
template <typename T>
__device__ __forceinline__ void dequant8(T* dst, const uint8_t* base, const CacheLayout& l,
                                         bool vec, int64_t block, int slot, int head, int d0,
                                         int kind, float scale) {
  uint8_t b[8];
  if (vec) {
    *reinterpret_cast<uint2*>(b) =
        *reinterpret_cast<const uint2*>(base + l.offset(block, slot, head, d0));
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) b[i] = base[l.offset(block, slot, head, d0 + i)];
  }
  float f[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = fp8_to_float(b[i], kind) * scale;
  store8(dst, f);
}

// Staged fp8 rows: the head_size bytes of row j of a tile sit at byte kRawOff of the row's own
// LD * 2 bytes (16-byte aligned, past the first DP + 16), so widening a row in place writes over
// only its own bytes: a warp that owns whole rows reads them all, then writes (widen_rows).
template <int DP>
constexpr int kRawOff = DP + 16;

template <typename T, int DP>
__device__ __forceinline__ uint8_t* raw_row(T* tile, int j) {
  return reinterpret_cast<uint8_t*>(tile + j * Tile<DP>::LD) + kRawOff<DP>;
}

// Keys (or values) [kt, kt + BN) of KV head `kvh` into dst [BN][LD]: the cached context from the
// paged cache (T; or fp8 bytes, staged raw by cp.async for widen_rows when `staged`, else
// dequantised with `scale` through registers), the new tokens (positions >= ctx) from `fresh`
// (token qs + key - ctx), zeros from k_hi on (their P is 0, and 0 * garbage could be NaN).
// Head-size padding columns stay as zeroed in the prologue (widen_rows rewrites them). Issues
// cp.async without committing.
template <typename T, int DP>
__device__ __forceinline__ void load_rows(T* dst, const void* cache, const CacheLayout& cl,
                                          bool cache_vec, int cache_fp8, bool staged, float scale,
                                          const T* fresh, const CacheLayout& fl, bool fresh_vec,
                                          const AttnParams& p, const int* bt, int kt, int k_hi,
                                          int ctx, int qs, int kvh) {
  using C = Tile<DP>;
#pragma unroll
  for (int idx = threadIdx.x; idx < C::BN * C::CH; idx += C::kThreads) {
    const int j = idx / C::CH, c = idx % C::CH, key = kt + j;
    if (c * 8 >= p.head_size) continue;
    T* d = dst + j * C::LD + c * 8;
    if (key >= k_hi) {
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    } else if (key < ctx) {
      const int bi = p.bs_shift >= 0 ? key >> p.bs_shift : key / p.block_size;
      const int slot = key - bi * p.block_size;
      const int b = bt[min(bi, p.max_blocks - 1)];
      const int64_t block = unsigned(b) < unsigned(p.num_blocks) ? b : 0;  // no wild reads
      if (staged) {
        cp_async8(raw_row<T, DP>(dst, j) + c * 8,
                  static_cast<const uint8_t*>(cache) + cl.offset(block, slot, kvh, c * 8));
      } else if (cache_fp8 != kNoFp8) {
        dequant8(d, static_cast<const uint8_t*>(cache), cl, cache_vec, block, slot, kvh, c * 8,
                 cache_fp8, scale);
      } else {
        copy8(d, static_cast<const T*>(cache), cl, cache_vec, block, slot, kvh, c * 8);
      }
    } else {
      copy8(d, fresh, fl, fresh_vec, int64_t(qs) + (key - ctx), 0, kvh, c * 8);
    }
  }
}

// Widens the staged fp8 rows [0, n_rows) of a landed K or V tile (load_rows with `staged`) into
// T x scale, in place, and zeroes their head-size padding. Each warp owns BN / 4 whole rows and
// takes them 32 / U at a time (U 8-byte units per row, one per lane): the lanes read their units,
// then write, so no write lands on bytes another lane has yet to read, and a lane holds one unit
// (the kernel's accumulators leave no registers for more). The caller syncs the CTA around it.
template <typename T, int DP, int KIND>
__device__ __forceinline__ void widen_rows_kind(T* tile, int n_rows, int head_size, float scale) {
  using C = Tile<DP>;
  constexpr int RW = C::BN / C::kWarps, U = DP / 8, RP = 32 / U;  // rows per warp, per pass
  const int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * RW;
  const int r_end = min(r0 + RW, n_rows), u = lane % U;
  for (int j0 = r0; j0 < r_end; j0 += RP) {
    const int j = j0 + lane / U;
    const bool row = lane < RP * U && j < r_end, data = row && u * 8 < head_size;
    uint2 raw = make_uint2(0u, 0u);
    if (data) raw = *reinterpret_cast<const uint2*>(raw_row<T, DP>(tile, j) + u * 8);
    __syncwarp();
    if (!row) continue;
    T* d = tile + j * C::LD + u * 8;
    if (!data) {
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
      continue;
    }
    const uint32_t w[2] = {raw.x, raw.y};
    float f[8];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 x = fp8x2_to_float2<KIND>(static_cast<uint16_t>(w[e >> 1] >> (16 * (e & 1))));
      f[2 * e] = x.x * scale;
      f[2 * e + 1] = x.y * scale;
    }
    store8(d, f);
  }
}

template <typename T, int DP>
__device__ __forceinline__ void widen_rows(T* tile, int n_rows, int head_size, int kind,
                                           float scale) {
  if (kind == kE5M2) {
    widen_rows_kind<T, DP, kE5M2>(tile, n_rows, head_size, scale);
  } else {
    widen_rows_kind<T, DP, kE4M3>(tile, n_rows, head_size, scale);
  }
}

// The BM x DP query tile (rows pack (token, query head of the group)); zeros for rows past the
// sequence and for the head-size padding.
template <typename T, int DP>
__device__ __forceinline__ void load_q(T* sQ, const AttnParams& p, bool vec, int qs, int rows,
                                       int r0, int kvh) {
  using C = Tile<DP>;
  const T* q = static_cast<const T*>(p.q);
  for (int idx = threadIdx.x; idx < C::BM * C::CH; idx += C::kThreads) {
    const int r = idx / C::CH, c = idx % C::CH, gr = r0 + r;
    T* dst = sQ + r * C::LD + c * 8;
    if (gr < rows && c * 8 < p.head_size) {
      const T* src = q + int64_t(qs + gr / p.group) * p.q_s_tok +
                     int64_t(kvh * p.group + gr % p.group) * p.q_s_head + c * 8;
      if (vec) {
        cp_async16(dst, src);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) dst[i] = src[i];
      }
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
  }
}

}  // namespace pagedkv::cuda_ops::prefill
