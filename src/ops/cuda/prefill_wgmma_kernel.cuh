// Hopper prefill / extend attention kernel (FlashAttention-3 style, sm_90a) over a paged prefix.
//
// A CTA owns BM = 128 query rows of one sequence and one KV head (rows pack (token, query head of
// the group) pairs like the mma.sync kernel, so each K/V tile serves the whole GQA group) and is
// three warpgroups (prefill_wgmma_tile.cuh):
//  - warpgroup 2, the producer, streams K and V tiles of BN keys (paged cache + new tokens) into
//    kStages 128-byte swizzled stages with cp.async; each tile half signals its own "full"
//    mbarrier through cp.async.mbarrier.arrive, and a stage is reused once both consumers have
//    arrived on its "empty" mbarrier.
//  - warpgroups 0 and 1, the consumers, own 64 rows each: S = Q K^T with wgmma (Q and K from
//    shared memory, both K-major), online softmax on the accumulators (prefill_softmax.cuh, masks
//    only on tiles that cross the diagonal / window or need soft-cap / alibi), then O += P V
//    with P packed to 16 bits in registers as the A operand and V read N-major (transpose flag).
// The consumers are not synchronised with each other, so one's softmax overlaps the other's
// wgmma. CTAs are ordered so that every sequence's last (longest causal) query tile starts first.
#pragma once

#include <algorithm>

#include "ops/cuda/prefill_mma.h"
#include "ops/cuda/prefill_softmax.cuh"
#include "ops/cuda/prefill_wgmma.h"
#include "ops/cuda/prefill_wgmma_tile.cuh"

namespace pagedkv::cuda_ops::prefill_wg {

// Where this CTA's work lies: sequence, KV head, first packed row and the key range.
struct CtaWork {
  int seq, kvh, qs, rows, r0, ctx, k_lo, k_hi, n_tiles;
};

template <int BM, int BN>
__device__ __forceinline__ bool cta_work(const AttnParams& p, CtaWork& w) {
  const int pairs = p.num_seqs * p.num_kv_heads;
  const int rank = blockIdx.x / pairs;
  w.seq = blockIdx.x % pairs / p.num_kv_heads;
  w.kvh = blockIdx.x % p.num_kv_heads;
  w.qs = min(max(p.query_start_loc[w.seq], 0), p.num_q);               // bad metadata: no wild
  const int qlen = min(p.query_start_loc[w.seq + 1], p.num_q) - w.qs;  // reads or writes
  w.rows = qlen * p.group;
  const int tile = (w.rows + BM - 1) / BM - 1 - rank;  // rank 0 = the sequence's last tile
  if (tile < 0) return false;
  w.r0 = tile * BM;
  w.ctx = p.seq_lens[w.seq] - qlen;
  w.k_hi = w.ctx + (min(w.r0 + BM, w.rows) - 1) / p.group + 1;
  w.k_lo = p.window > 0 ? max(0, w.ctx + w.r0 / p.group - p.window + 1) : 0;
  w.n_tiles = w.k_hi > w.k_lo ? (w.k_hi - w.k_lo + BN - 1) / BN : 0;
  return true;
}

#if PAGEDKV_WGMMA_ENABLED

// Producer warpgroup: every K/V tile of the CTA, kStages ahead of the slower consumer.
template <typename T, int DP>
__device__ __forceinline__ void produce(const AttnParams& p, const CtaWork& w, uint32_t sbase,
                                        uint64_t* bars) {
  using C = Tile<DP>;
  uint64_t *full_k = bars, *full_v = bars + C::kStages, *empty = bars + 2 * C::kStages;
  const int ptid = threadIdx.x - 256;
  const int* bt = p.block_tables + int64_t(w.seq) * p.bt_stride;
  for (int it = 0; it < w.n_tiles; ++it) {
    const int stage = it % C::kStages, kt = w.k_lo + it * C::BN;
    if (it >= C::kStages) wgmma::mbar_wait(&empty[stage], (it / C::kStages - 1) & 1);
    load_kv<T, DP>(sbase + C::kKOff + stage * C::kKVBytes, static_cast<const T*>(p.k_cache), p.kl,
                   static_cast<const T*>(p.k_new), p.knl, p, bt, kt, w.k_hi, w.ctx, w.qs, w.kvh,
                   ptid);
    wgmma::mbar_arrive_cp_async(&full_k[stage]);
    load_kv<T, DP>(sbase + C::kVOff + stage * C::kKVBytes, static_cast<const T*>(p.v_cache), p.vl,
                   static_cast<const T*>(p.v_new), p.vnl, p, bt, kt, w.k_hi, w.ctx, w.qs, w.kvh,
                   ptid);
    wgmma::mbar_arrive_cp_async(&full_v[stage]);
  }
  cp_async_wait_all();  // nothing in flight when the thread exits
}

// S = Q K^T for this warpgroup's 64 rows and one K stage (d = 0 .. DP in k-steps of 16).
template <typename T, int DP>
__device__ __forceinline__ void qk(float (&s)[16][4], uint32_t q_addr, uint32_t k_addr) {
  using C = Tile<DP>;
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < DP / 16; ++kk) {
    // k-step kk: 64-column block kk / 4 (BM or BN rows of 128 bytes), 32 bytes per 16 columns.
    const uint32_t col = (kk % 4) * 32;
    const uint64_t da = wgmma::desc_sw128(q_addr + (kk / 4) * C::BM * 128 + col, 16, 1024);
    const uint64_t db = wgmma::desc_sw128(k_addr + (kk / 4) * C::BN * 128 + col, 16, 1024);
    wgmma::mma_ss_n128<T>(s, da, db, kk > 0);
  }
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::fence_operand(s);
}

// O += P V: P (the softmax probabilities in s) packed to T as register A fragments, V from one
// stage read N-major (keys 16kk .. 16kk + 15 per k-step: 16 rows of 128 bytes).
template <typename T, int DP>
__device__ __forceinline__ void pv(float (&o)[DP / 8][4], const float (&s)[16][4],
                                   uint32_t v_addr) {
  using C = Tile<DP>;
  uint32_t a[C::BN / 16][4];
#pragma unroll
  for (int kk = 0; kk < C::BN / 16; ++kk) {
    a[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    a[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    a[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
  wgmma::fence_operand(o);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < C::BN / 16; ++kk) {
    wgmma::mma_rs_tn<T>(o, a[kk], wgmma::desc_sw128(v_addr + kk * 16 * 128, C::BN * 128, 1024));
  }
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::fence_operand(o);
}

// Normalises this thread's O rows, stages them (swizzled) in the warpgroup's own Q rows, and
// writes them out with 16-byte stores where the output rows allow it.
template <typename T, int DP>
__device__ __forceinline__ void store_o(const AttnParams& p, const CtaWork& w, bool vec_out,
                                        float (&o)[DP / 8][4], float (&l)[2], unsigned char* sQ,
                                        int wg) {
  using C = Tile<DP>;
  const int wtid = threadIdx.x & 127, lane = threadIdx.x & 31, warp = wtid >> 5;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
    const int r = wg * 64 + warp * 16 + lane / 4 + 8 * h;
#pragma unroll
    for (int j = 0; j < DP / 8; ++j) {
      *reinterpret_cast<uint32_t*>(sQ + wgmma::sw128(r, j, C::BM) + 4 * (lane & 3)) =
          pack2<T>(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
    }
  }
  wgmma::bar_sync(1 + wg, 128);
  T* out = static_cast<T*>(p.out);
  for (int idx = wtid; idx < 64 * C::CH; idx += 128) {
    const int r = wg * 64 + idx / C::CH, c = idx % C::CH, gr = w.r0 + r;
    if (gr >= w.rows) continue;
    T* dst = out + int64_t(w.qs + gr / p.group) * p.o_s_tok +
             int64_t(w.kvh * p.group + gr % p.group) * p.o_s_head + c * 8;
    const uint4 v = *reinterpret_cast<const uint4*>(sQ + wgmma::sw128(r, c, C::BM));
    if (vec_out) {
      *reinterpret_cast<uint4*>(dst) = v;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) dst[e] = reinterpret_cast<const T*>(&v)[e];
    }
  }
}

// Consumer warpgroup wg: its 64 rows over every K/V tile of the CTA.
template <typename T, int DP>
__device__ __forceinline__ void consume(const AttnParams& p, const prefill::VecFlags& vf,
                                        const CtaWork& w, unsigned char* smem, uint64_t* bars,
                                        int wg) {
  using C = Tile<DP>;
  uint64_t *full_k = bars, *full_v = bars + C::kStages, *empty = bars + 2 * C::kStages;
  const int wtid = threadIdx.x & 127, lane = threadIdx.x & 31, warp = wtid >> 5;
  const uint32_t sbase = smem_addr(smem);
  const int wr0 = w.r0 + wg * 64;

  load_q<T, DP>(sbase, p, vf.q, w.qs, w.rows, w.r0, wr0, w.kvh, wtid);
  cp_async_wait_all();
  wgmma::fence_proxy_async();
  wgmma::bar_sync(1 + wg, 128);

  // Warpgroup-uniform row range (positions of its first and last live rows).
  const bool wg_live = wr0 < w.rows;
  const int q_min = w.ctx + wr0 / p.group, q_max = w.ctx + (min(wr0 + 64, w.rows) - 1) / p.group;
  const bool extras = p.softcap > 0.f || p.alibi != nullptr || !(p.qk_scale > 0.f);
  float o[DP / 8][4];
#pragma unroll
  for (int j = 0; j < DP / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const uint32_t q_addr = sbase + wg * 64 * 128;

  for (int it = 0; it < w.n_tiles; ++it) {
    const int stage = it % C::kStages, kt = w.k_lo + it * C::BN;
    const uint32_t parity = (it / C::kStages) & 1;
    const bool live =
        wg_live && kt <= q_max && !(p.window > 0 && kt + C::BN - 1 <= q_min - p.window);
    const bool plain =
        !extras && kt + C::BN - 1 <= q_min && (p.window <= 0 || kt > q_max - p.window);
    // Even a dead warpgroup waits for the stage: its "empty" arrival must not let the producer
    // refill a stage whose copies are still landing.
    wgmma::mbar_wait(&full_k[stage], parity);
    wgmma::fence_proxy_async();
    float s[1][16][4];
    if (live) {
      qk<T, DP>(s[0], q_addr, sbase + C::kKOff + stage * C::kKVBytes);
      float alpha[2];
      prefill::online_softmax<1, C::BN>(s, m, l, alpha, plain, p, kt, wr0 + warp * 16, w.rows,
                                        w.ctx, w.kvh);
#pragma unroll
      for (int j = 0; j < DP / 8; ++j) {
        o[j][0] *= alpha[0];
        o[j][1] *= alpha[0];
        o[j][2] *= alpha[1];
        o[j][3] *= alpha[1];
      }
    }
    wgmma::mbar_wait(&full_v[stage], parity);
    wgmma::fence_proxy_async();
    if (live) pv<T, DP>(o, s[0], sbase + C::kVOff + stage * C::kKVBytes);
    __syncwarp();
    if (lane == 0) wgmma::mbar_arrive(&empty[stage]);
  }
  store_o<T, DP>(p, w, vf.out, o, l, smem, wg);
}

#endif  // PAGEDKV_WGMMA_ENABLED

template <typename T, int DP>
__global__ void __launch_bounds__(Tile<DP>::kThreads, 1)
    prefill_wgmma_kernel(const AttnParams p, const prefill::VecFlags vf) {
#if PAGEDKV_WGMMA_ENABLED
  using C = Tile<DP>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // Swizzled atoms must sit on 1024-byte boundaries: align the base by hand (kSmem has the slack).
  const uint32_t raw = smem_addr(smem_raw);
  unsigned char* smem = smem_raw + ((1024 - (raw & 1023)) & 1023);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + C::kBarOff);

  CtaWork w;
  if (!cta_work<C::BM, C::BN>(p, w)) return;  // CTA-uniform
  if (threadIdx.x == 0) {
    for (int i = 0; i < C::kStages; ++i) {
      wgmma::mbar_init(&bars[i], 128);                 // full_k: producer threads
      wgmma::mbar_init(&bars[C::kStages + i], 128);    // full_v
      wgmma::mbar_init(&bars[2 * C::kStages + i], 8);  // empty: consumer warps
    }
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == C::kConsumers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::kProducerRegs));
    produce<T, DP>(p, w, smem_addr(smem), bars);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::kConsumerRegs));
    consume<T, DP>(p, vf, w, smem, bars, wg);
  }
#else
  __trap();  // never launched: the host only picks this kernel on sm_90 with sm_90a code
#endif
}

}  // namespace pagedkv::cuda_ops::prefill_wg
