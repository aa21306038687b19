// Consumer warpgroups of the Hopper wgmma prefill kernel (prefill_wgmma_kernel.cuh): each owns 64
// query rows and walks every K/V stage the producer hands over: S = Q K^T, softmax, O += P V, each
// wgmma waited for at once, while the other consumer warpgroup keeps the tensor cores busy (in
// CTAs without a cached prefix by schedule: the two take turns issuing S, Turns below). A
// pipelined form (S of tile i + 1 in flight with P_i V_i, FlashAttention-3's intra-warpgroup
// overlap, plus the turns) measured 10-12 % slower on every benchmark shape and was removed;
// benchmarks/RESULTS.md has the runs.
#pragma once

#include "ops/cuda/bulk_copy.cuh"
#include "ops/cuda/prefill_mma.h"
#include "ops/cuda/prefill_softmax.cuh"
#include "ops/cuda/prefill_wgmma_fp8.cuh"
#include "ops/cuda/prefill_wgmma_tile.cuh"

namespace pagedkv::cuda_ops::prefill_wg {

#if PAGEDKV_WGMMA_ENABLED

// Issues S = Q K^T for this warpgroup's 64 rows and one K stage (d in k-steps of 16): one
// committed wgmma group.
template <typename T, int DP>
__device__ __forceinline__ void issue_qk(float (&s)[16][4], uint32_t q_addr, uint32_t k_addr) {
  using C = Tile<DP>;
#pragma unroll
  for (int kk = 0; kk < DP / 16; ++kk) {
    // k-step kk: 64-column block kk / 4 (BM or BN rows of 128 bytes), 32 bytes per 16 columns.
    const uint32_t col = (kk % 4) * 32;
    const uint64_t da = wgmma::desc_sw128(q_addr + (kk / 4) * C::BM * 128 + col, 16, 1024);
    const uint64_t db = wgmma::desc_sw128(k_addr + (kk / 4) * C::BN * 128 + col, 16, 1024);
    wgmma::mma_ss_n128<T>(s, da, db, kk > 0);
  }
  wgmma::commit();
}

// P (probabilities in the S accumulators) as 16-bit register A fragments, one per 16 keys.
template <typename T>
__device__ __forceinline__ void pack_p(uint32_t (&a)[8][4], const float (&s)[16][4]) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    a[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    a[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    a[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// Issues O += P V with V from one stage read N-major (k-step kk: keys 16kk .. 16kk + 15, i.e. 16
// rows of 128 bytes): one committed wgmma group.
template <typename T, int DP>
__device__ __forceinline__ void issue_pv(float (&o)[DP / 8][4], const uint32_t (&a)[8][4],
                                         uint32_t v_addr) {
  using C = Tile<DP>;
#pragma unroll
  for (int kk = 0; kk < C::BN / 16; ++kk) {
    wgmma::mma_rs_tn<T>(o, a[kk], wgmma::desc_sw128(v_addr + kk * 16 * 128, C::BN * 128, 1024));
  }
  wgmma::commit();
}

template <int DP>
__device__ __forceinline__ void rescale(float (&o)[DP / 8][4], const float (&alpha)[2]) {
#pragma unroll
  for (int j = 0; j < DP / 8; ++j) {
    o[j][0] *= alpha[0];
    o[j][1] *= alpha[0];
    o[j][2] *= alpha[1];
    o[j][3] *= alpha[1];
  }
}

// Waits until the producer's copies of one half-stage landed, and makes them visible to wgmma.
// Every consumer waits, live or not: its "empty" arrival must not let the producer refill a stage
// whose copies are still landing (their completions would count toward the next phase).
__device__ __forceinline__ void wait_full(uint64_t* bar, int it, int stages) {
  wgmma::mbar_wait(bar, (it / stages) & 1);
  wgmma::fence_proxy_async();
}

// One arrival per consumer warp on the stage's "empty" barrier (expected count 8).
__device__ __forceinline__ void release(uint64_t* bar) {
  __syncwarp();
  if ((threadIdx.x & 31) == 0) wgmma::mbar_arrive(bar);
}

// This warpgroup's rows and the per-tile decisions (warpgroup-uniform).
struct WgRows {
  int wr0, q_min, q_max;  // first packed row; last keys its first and last live rows see
  int warp_row;           // first packed row of this thread's warp
  bool any, extras;       // any live row; soft-cap / alibi / odd scale: every tile masked

  __device__ WgRows(const AttnParams& p, const CtaWork& w, int wg) {
    wr0 = w.r0 + wg * 64;
    warp_row = wr0 + ((threadIdx.x & 127) >> 5) * 16;
    any = wr0 < w.rows;
    q_min = prefill::last_key(p, w.ctx, wr0, w.rows);
    q_max = prefill::last_key(p, w.ctx, min(wr0 + 64, w.rows) - 1, w.rows);
    extras = p.softcap > 0.f || p.alibi != nullptr || !(p.qk_scale > 0.f);
  }
  // Keys [kt, kt + BN) touch these rows (causally, and inside the window).
  __device__ bool live(const AttnParams& p, int kt, int bn) const {
    return any && kt <= q_max && !(p.window > 0 && kt + bn - 1 <= q_min - p.window);
  }
  // ... and how much per-element work their scores need (prefill_softmax.cuh).
  __device__ prefill::TileKind kind(const AttnParams& p, int kt, int bn) const {
    if (extras) return prefill::TileKind::kGeneral;
    const bool all_visible = kt + bn - 1 <= q_min && (p.window <= 0 || kt > q_max - p.window);
    return all_visible ? prefill::TileKind::kPlain : prefill::TileKind::kPositions;
  }
  // Online softmax of the S accumulators of keys [kt, kt + BN) on this warp's rows.
  template <int BN>
  __device__ void softmax(const AttnParams& p, const CtaWork& w, int kt, float (&s)[1][BN / 8][4],
                          float (&m)[2], float (&l)[2], float (&alpha)[2]) const {
    prefill::online_softmax<1, BN>(s, m, l, alpha, kind(p, kt, BN), p, kt, warp_row, w.rows, w.ctx,
                                   w.kvh);
  }
};

// The stage barriers as the consumers use them, by the CTA's tile count `it`: stage it % kStages,
// phase parity (it / kStages) & 1.
template <int kStages>
struct StageBars {
  uint64_t *full_k, *full_v, *empty;

  __device__ explicit StageBars(uint64_t* bars)
      : full_k(bars), full_v(bars + kStages), empty(bars + 2 * kStages) {}
  __device__ void wait_k(int it) const { wait_full(&full_k[it % kStages], it, kStages); }
  __device__ void wait_v(int it) const { wait_full(&full_v[it % kStages], it, kStages); }
  __device__ void free(int it) const { release(&empty[it % kStages]); }
};

// Normalises this thread's O rows and stages them (swizzled) in the warpgroup's own Q rows (no
// wgmma reads them any more). A warpgroup whose 64 rows all lie in the sequence then writes them
// with one TMA box per 128-byte slice (o_map), else its threads write the live rows with 16-byte
// stores where the rows allow it: per-CTA work is what short sequences pay for.
template <typename T, int DP>
__device__ __forceinline__ void store_o(const WgParams& wp, const CtaWork& w, float (&o)[DP / 8][4],
                                        float (&l)[2], unsigned char* sQ, int wg) {
  using C = Tile<DP>;
  const AttnParams& p = wp.a;
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
  const int wr0 = w.r0 + wg * 64;
  if (wp.o_tma && wr0 + 64 <= w.rows) {
    wgmma::fence_proxy_async();  // the generic writes above, visible to the copy engine
    wgmma::bar_sync(1 + wg, 128);
    if (wtid == 0) {
      const int tok = w.qs + wr0 / p.group;  // the group divides 64 (o_tma)
#pragma unroll
      for (int cb = 0; cb < DP / 64; ++cb) {
        tma_store_3d(sQ + cb * C::BM * 128 + wg * 64 * 128, &wp.o_map, cb * 64, w.kvh * p.group,
                     tok);
      }
      bulk_commit();
      bulk_wait_read();  // the shared memory stays valid until the copies have read it
    }
    return;
  }
  wgmma::bar_sync(1 + wg, 128);
  T* out = static_cast<T*>(p.out);
  // Row gr is (token gr / group, head gr % group): shifts for the usual power-of-two groups (an
  // integer division is ~20 instructions, and this loop runs 8 times per thread).
  const int gshift = (p.group & (p.group - 1)) == 0 ? __ffs(p.group) - 1 : -1;
  for (int idx = wtid; idx < 64 * C::CH; idx += 128) {
    const int r = wg * 64 + idx / C::CH, c = idx % C::CH, gr = w.r0 + r;
    if (gr >= w.rows) continue;
    const int tok = gshift >= 0 ? gr >> gshift : gr / p.group, h = gr - tok * p.group;
    T* dst =
        out + int64_t(w.qs + tok) * p.o_s_tok + int64_t(w.kvh * p.group + h) * p.o_s_head + c * 8;
    const uint4 v = *reinterpret_cast<const uint4*>(sQ + wgmma::sw128(r, c, C::BM));
    if (wp.vf.out) {
      *reinterpret_cast<uint4*>(dst) = v;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) dst[e] = reinterpret_cast<const T*>(&v)[e];
    }
  }
}

// Turn-taking of the two consumers (FlashAttention-3's ping-pong): consumer wg issues its
// S = Q K^T only in its turn (named barrier 3 + wg) and hands the turn over at once, so the
// tensor cores take the two S products one after the other and one consumer's softmax runs
// under the other's GEMMs instead of both softmaxes at the same time. Every consumer passes every
// turn, live tile or not; consumer 1 hands consumer 0 the first turn, and consumer 0 takes the
// hand-over left after the last tile, so no barrier is left half-arrived.
struct Turns {
  bool on;
  int wg;
  __device__ void begin() const {
    if (on && wg == 1) wgmma::bar_arrive(3, 256);
  }
  __device__ void wait() const {
    if (on) wgmma::bar_sync(3 + wg, 256);
  }
  __device__ void pass() const {
    if (on) wgmma::bar_arrive(4 - wg, 256);
  }
  __device__ void end() const {
    if (on && wg == 0) wgmma::bar_sync(3, 256);
  }
};

// Consumer warpgroup wg: per tile S, softmax, P V, each waited for at once. kFp8: an fp8 cache,
// whose tiles' raw groups the consumers may dequantise under their wgmma (consumer_dequant).
template <typename T, int DP, bool kFp8>
__device__ __forceinline__ void consume(const WgParams& wp, const CtaWork& w, uint32_t sbase,
                                        uint64_t* bars, int wg, float (&o)[DP / 8][4],
                                        float (&l)[2], bool turns) {
  using C = Tile<DP>;
  const AttnParams& p = wp.a;
  const StageBars<C::kStages> sb(bars);
  const WgRows wr(p, w, wg);
  const Turns turn{turns, wg};
  const uint32_t q_addr = sbase + wg * 64 * 128;
  float m[2] = {-INFINITY, -INFINITY};
  turn.begin();
  // fp8 (consumer_dequant): the raw groups of K or V tile j, dequantised by the consumers while
  // the wgmma before them runs: P V of tile j - 1 (S = Q K^T of the first tile for its V, nothing
  // for its K). Each returns whether tile j has raw groups (its ready barrier then guards it).
  auto dequant = [&](bool is_v, int j) {
    if constexpr (kFp8) {
      if (wp.consumer_dequant < (is_v ? 1 : 2)) return false;
      const int st = j % C::kStages;
      return consumer_dequant_group<T, DP>(
          wp, w, sbase + (is_v ? C::kVOff : C::kKOff) + st * C::kKVBytes,
          bars + C::kRawBar + (is_v ? C::kStages : 0) + st, (j / C::kStages) & 1,
          w.k_lo + j * C::BN, is_v ? p.v_scale.get() : p.k_scale.get());
    }
    return false;
  };
  // fp8: whether tile it's K / V groups are being dequantised by the consumers.
  [[maybe_unused]] bool k_raw = w.n_tiles > 0 && dequant(false, 0), v_raw = false;
  for (int it = 0; it < w.n_tiles; ++it) {
    const int stage = it % C::kStages, kt = w.k_lo + it * C::BN;
    const bool live = wr.live(p, kt, C::BN);
    sb.wait_k(it);
    if constexpr (kFp8) {
      if (k_raw) wgmma::bar_sync(kKReadyBar, 256);  // every consumer's K group written
    }
    float s[1][16][4];
    uint32_t a[8][4];
    turn.wait();
    if (live) {  // one block from issue to wait: ptxas serialises wgmma it cannot pair (C7520)
      wgmma::fence();
      issue_qk<T, DP>(s[0], q_addr, sbase + C::kKOff + stage * C::kKVBytes);
      turn.pass();
      if (it == 0) v_raw = dequant(true, 0);
      wgmma::wait<0>();
      wgmma::fence_operand(s[0]);
      float alpha[2];
      wr.softmax<C::BN>(p, w, kt, s, m, l, alpha);
      rescale<DP>(o, alpha);
      pack_p<T>(a, s[0]);
    } else {
      turn.pass();
      if (it == 0) v_raw = dequant(true, 0);
    }
    sb.wait_v(it);
    if constexpr (kFp8) {
      if (v_raw) wgmma::bar_sync(kVReadyBar, 256);  // every consumer's V group written
    }
    // fp8: the next tile's groups, K first (S needs it first).
    auto dequant_next = [&] {
      if (it + 1 < w.n_tiles) {
        k_raw = dequant(false, it + 1);
        v_raw = dequant(true, it + 1);
      }
    };
    if (live) {
      wgmma::fence_operand(o);
      wgmma::fence();
      issue_pv<T, DP>(o, a, sbase + C::kVOff + stage * C::kKVBytes);
      dequant_next();
      wgmma::wait<0>();
      wgmma::fence_operand(o);
    } else {
      dequant_next();
    }
    sb.free(it);
  }
  turn.end();
}

#endif  // PAGEDKV_WGMMA_ENABLED

}  // namespace pagedkv::cuda_ops::prefill_wg
