// Hopper prefill / extend attention kernel (FlashAttention-3 style, sm_90a) over a paged prefix.
//
// A CTA owns BM = 128 query rows of one sequence and one KV head (rows pack (token, query head of
// the group) pairs like the mma.sync kernel, so each K/V tile serves the whole GQA group) and is
// three warpgroups (prefill_wgmma_tile.cuh):
//  - warpgroup 2, the producer, copies the query tile (one TMA box per 128-byte slice where the
//    group size allows, else the consumers load their rows) and streams K and V tiles of BN keys
//    (paged cache + new tokens) into kStages 128-byte swizzled stages, with TMA tensor copies where
//    the maps serve and cp.async elsewhere (prefill_wgmma_produce.cuh); each tile half signals its
//    own "full" mbarrier, and a stage is reused once both consumers have arrived on its "empty"
//    mbarrier.
//  - warpgroups 0 and 1, the consumers, own 64 rows each: S = Q K^T with wgmma (Q and K from
//    shared memory, both K-major), online softmax on the accumulators (prefill_softmax.cuh, masks
//    only on tiles that cross the diagonal / window or need soft-cap / alibi), then O += P V
//    with P packed to 16 bits in registers as the A operand and V read N-major (transpose flag).
// In CTAs without a cached prefix the consumers take turns issuing S = Q K^T, so one's softmax
// runs under the other's wgmma (FlashAttention-3's ping-pong); elsewhere they overlap by chance
// (prefill_wgmma_consume.cuh).
// CTAs take the query tiles of a few (sequence, KV head) pairs at a time, longest first, so that
// the ones running together share their K/V through L2 (prefill_order.cuh).
#pragma once

#include <algorithm>

#include "ops/cuda/prefill_mma.h"
#include "ops/cuda/prefill_wgmma.h"
#include "ops/cuda/prefill_wgmma_consume.cuh"
#include "ops/cuda/prefill_wgmma_produce.cuh"
#include "ops/cuda/prefill_wgmma_tile.cuh"

namespace pagedkv::cuda_ops::prefill_wg {

#if PAGEDKV_WGMMA_ENABLED

// Consumer warpgroup wg: loads its Q rows, runs the tile loop, writes its O rows.
template <typename T, int DP, bool kFp8>
__device__ __forceinline__ void consumer(const WgParams& wp, const CtaWork& w, unsigned char* smem,
                                         uint64_t* bars, int wg) {
  using C = Tile<DP>;
  const AttnParams& p = wp.a;
  const uint32_t sbase = smem_addr(smem);
  if (wp.q_tma) {  // the producer's tensor copy (rows past the sequence: unused data or zeros)
    wgmma::mbar_wait(bars + C::kQBar, 0);
  } else {
    load_q<T, DP>(sbase, p, wp.vf.q, w.qs, w.rows, w.r0, w.r0 + wg * 64, w.kvh, threadIdx.x & 127);
    cp_async_wait_all();
    wgmma::fence_proxy_async();
    wgmma::bar_sync(1 + wg, 128);
  }

  float o[DP / 8][4];
#pragma unroll
  for (int j = 0; j < DP / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float l[2] = {0.f, 0.f};
  // Turn-taking consumers in CTAs without a cached prefix: on an H100 4 % faster at 32x512, 1 %
  // at 8x2048, level at 1x8192; over a long prefix 1-1.5 % slower (benchmarks/RESULTS.md).
  consume<T, DP, kFp8>(wp, w, sbase, bars, wg, o, l, w.ctx == 0);
  store_o<T, DP>(wp, w, o, l, smem, wg);
}

#endif  // PAGEDKV_WGMMA_ENABLED

// kFp8: an fp8 cache (the producer and the consumers dequantise it: prefill_wgmma_fp8.cuh).
template <typename T, int DP, bool kFp8>
__global__ void __launch_bounds__(Tile<DP>::kThreads, 1)
    prefill_wgmma_kernel(const __grid_constant__ WgParams wp) {
#if PAGEDKV_WGMMA_ENABLED
  using C = Tile<DP>;
  const AttnParams& p = wp.a;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // Swizzled atoms must sit on 1024-byte boundaries: align the base by hand (kSmem has the slack).
  const uint32_t raw = smem_addr(smem_raw);
  unsigned char* smem = smem_raw + ((1024 - (raw & 1023)) & 1023);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + C::kBarOff);

  CtaWork w;
  if (!cta_work<C::BM, C::BN>(p, w)) return;  // CTA-uniform
  if (threadIdx.x == 0) {
    for (int i = 0; i < C::kStages; ++i) {
      wgmma::mbar_init(&bars[i], kFullArrivals);               // full_k: producer threads
      wgmma::mbar_init(&bars[C::kStages + i], kFullArrivals);  // full_v
      wgmma::mbar_init(&bars[2 * C::kStages + i], 8);          // empty: consumer warps
    }
    wgmma::mbar_init(&bars[C::kQBar], 1);  // the query tile: the producer's expect-tx
    if constexpr (kFp8) {
      for (int i = 0; i < 2 * C::kStages; ++i) wgmma::mbar_init(&bars[C::kRawBar + i], 1);
    }
    mbar_init_fence();  // the barriers visible to the copy engine
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == C::kConsumers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::kProducerRegs));
    produce<T, DP, kFp8>(wp, w, smem, bars);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::kConsumerRegs));
    consumer<T, DP, kFp8>(wp, w, smem, bars, wg);
  }
#else
  __trap();  // never launched: the host only picks this kernel on sm_90 with sm_90a code
#endif
}

}  // namespace pagedkv::cuda_ops::prefill_wg
