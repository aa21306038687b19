// Tensor-core prefill / extend attention kernel (FlashAttention-2 style) over a paged prefix.
//
// A CTA of 4 warps owns BM query rows of one sequence and one KV head (prefill_tile.cuh); rows pack
// (token, query head of the group) pairs, so every K/V tile loaded into shared memory serves the
// whole GQA group. Each warp computes S = Q K^T for its 32 (16 for head sizes > 128) rows with
// mma.sync m16n8k16 (fp32 accumulators), masks only tiles that cross its diagonal, window edge or
// need soft-cap / alibi, updates an online softmax in registers (exp2 with the scale folded into
// one FMA, prefill_softmax.cuh) and accumulates O += P V with P taken straight from the S
// accumulators. K and V tiles are separate cp.async groups, double-buffered: S of tile i starts as
// soon as K_i lands, while V_i and both halves of tile i + 1 are in flight. CTAs take the query
// tiles of a few (sequence, KV head) pairs at a time, longest first (prefill_order.cuh).
#pragma once

#include <algorithm>

#include "ops/cuda/prefill_mma.h"
#include "ops/cuda/prefill_order.cuh"
#include "ops/cuda/prefill_softmax.cuh"
#include "ops/cuda/prefill_tile.cuh"

namespace pagedkv::cuda_ops::prefill {

template <typename T, int DP>
__global__ void __launch_bounds__(Tile<DP>::kThreads, 2)
    prefill_mma_kernel(const AttnParams p, const VecFlags vf) {
  using C = Tile<DP>;
  constexpr int MT = C::MT, BM = C::BM, BN = C::BN, LD = C::LD, CH = C::CH, NR = 2 * MT;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);  // [BM][LD]
  T* sK = sQ + BM * LD;                // [2][BN][LD]
  T* sV = sK + 2 * BN * LD;            // [2][BN][LD]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const prefill::TileSlot slot = tile_slot(p);
  const int rank = slot.rank, seq = slot.pair / p.num_kv_heads;
  const int kvh = slot.pair % p.num_kv_heads, G = p.group;
  const int qs = min(max(p.query_start_loc[seq], 0), p.num_q);     // bad metadata: no wild
  const int qlen = min(p.query_start_loc[seq + 1], p.num_q) - qs;  // reads or writes
  const int rows = qlen * G;
  const int tile = (rows + BM - 1) / BM - 1 - rank;  // rank 0 = the sequence's last tile
  if (tile < 0) return;
  const int r0 = tile * BM;
  const int ctx = p.seq_lens[seq] - qlen;
  // Causal: up to the tile's last row; else every row sees the whole sequence.
  const int k_hi = p.causal ? ctx + (min(r0 + BM, rows) - 1) / G + 1 : ctx + qlen;
  const int k_lo = p.window > 0 ? max(0, ctx + r0 / G - p.window + 1) : 0;
  const int* bt = p.block_tables + int64_t(seq) * p.bt_stride;
  // fp8 caches with 8-byte runs stage their bytes (VecFlags::cache_fp8); vLLM's value layout,
  // whose elements stride along d, dequantises through registers.
  const bool stage_k = vf.cache_fp8 != kNoFp8 && vf.k_cache;
  const bool stage_v = vf.cache_fp8 != kNoFp8 && vf.v_cache;
  auto load_k = [&](int kt, int stage) {
    load_rows<T, DP>(sK + stage * BN * LD, p.k_cache, p.kl, vf.k_cache, vf.cache_fp8, stage_k,
                     p.k_scale.get(), static_cast<const T*>(p.k_new), p.knl, vf.fresh, p, bt, kt,
                     k_hi, ctx, qs, kvh);
  };
  auto load_v = [&](int kt, int stage) {
    load_rows<T, DP>(sV + stage * BN * LD, p.v_cache, p.vl, vf.v_cache, vf.cache_fp8, stage_v,
                     p.v_scale.get(), static_cast<const T*>(p.v_new), p.vnl, vf.fresh, p, bt, kt,
                     k_hi, ctx, qs, kvh);
  };
  // Staged rows of tile kt (cached keys [kt, min(ctx, k_hi)), a prefix of the tile) widened in
  // place: between two CTA barriers, the first of which the caller has passed.
  auto widen = [&](bool staged, T* tile, int kt, float scale) {
    const int n_rows = min(min(ctx, k_hi) - kt, BN);
    if (!staged || n_rows <= 0) return;  // uniform across the CTA
    widen_rows<T, DP>(tile, n_rows, p.head_size, vf.cache_fp8, scale);
    __syncthreads();
  };

  // Zeros in the K/V head-size padding (loads never write those columns).
  if (p.head_size < DP) {
    for (int idx = tid; idx < 2 * BN * CH; idx += C::kThreads) {
      const int j = idx / CH, c = idx % CH;
      if (c * 8 >= p.head_size) {
        *reinterpret_cast<uint4*>(sK + j * LD + c * 8) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(sV + j * LD + c * 8) = make_uint4(0, 0, 0, 0);
      }
    }
  }
  const int n_tiles = k_hi > k_lo ? (k_hi - k_lo + BN - 1) / BN : 0;
  load_q<T, DP>(sQ, p, vf.q, qs, rows, r0, kvh);
  if (n_tiles > 0) load_k(k_lo, 0);
  cp_async_commit();  // group: Q + K_0
  if (n_tiles > 0) load_v(k_lo, 0);
  cp_async_commit();  // group: V_0

  // This thread's accumulator rows: i = 2 * mt + h is row wr0 + mt * 16 + lane / 4 + 8 * h.
  const int wr0 = r0 + warp * MT * 16;
  const bool warp_live = wr0 < rows;
  // The last keys the warp's first and last rows see.
  const int w_qmin = last_key(p, ctx, wr0, rows);
  const int w_qmax = last_key(p, ctx, min(wr0 + MT * 16, rows) - 1, rows);
  float o[MT][DP / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < DP / 8; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
  float m[NR], l[NR];
#pragma unroll
  for (int i = 0; i < NR; ++i) m[i] = -INFINITY, l[i] = 0.f;

  const bool extras = p.softcap > 0.f || p.alibi != nullptr || !(p.qk_scale > 0.f);
  const T* qw = sQ + warp * MT * 16 * LD;
  for (int it = 0; it < n_tiles; ++it) {
    const int kt = k_lo + it * BN, stage = it & 1;
    cp_async_wait<1>();  // K_it (and Q) landed; V_it may still be in flight
    __syncthreads();     // ... for every thread; and stage ^ 1 is no longer read
    if (it + 1 < n_tiles) {
      load_k(kt + BN, stage ^ 1);
      cp_async_commit();
      load_v(kt + BN, stage ^ 1);
      cp_async_commit();
    }
    widen(stage_k, sK + stage * BN * LD, kt, p.k_scale.get());
    // Warp-uniform: does the tile touch this warp's rows, and does it need per-element masks?
    const bool live =
        warp_live && kt <= w_qmax && !(p.window > 0 && kt + BN - 1 <= w_qmin - p.window);
    const TileKind kind = extras ? TileKind::kGeneral
                          : kt + BN - 1 <= w_qmin && (p.window <= 0 || kt > w_qmax - p.window)
                              ? TileKind::kPlain
                              : TileKind::kPositions;
    float s[MT][BN / 8][4];
    if (live) {
      const T* tk = sK + stage * BN * LD;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < BN / 8; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0;
#pragma unroll
      for (int kk = 0; kk < DP / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          ldmatrix_x4(a[mt], qw + (mt * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int nb = 0; nb < BN / 16; ++nb) {
          uint32_t b[4];
          ldmatrix_x4(b, tk + (nb * 16 + (lane >> 4) * 8 + (lane & 7)) * LD + kk * 16 +
                             ((lane >> 3) & 1) * 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_16816<T>(s[mt][2 * nb], a[mt], b[0], b[1]);
            mma_16816<T>(s[mt][2 * nb + 1], a[mt], b[2], b[3]);
          }
        }
      }

      float alpha[NR];
      online_softmax<MT, BN>(s, m, l, alpha, kind, p, kt, wr0, rows, ctx, kvh);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < DP / 8; ++n) {
          o[mt][n][0] *= alpha[2 * mt];
          o[mt][n][1] *= alpha[2 * mt];
          o[mt][n][2] *= alpha[2 * mt + 1];
          o[mt][n][3] *= alpha[2 * mt + 1];
        }
    }
    if (it + 1 < n_tiles) {
      cp_async_wait<2>();  // V_it landed (tile it + 1 may still be in flight)
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    widen(stage_v, sV + stage * BN * LD, kt, p.v_scale.get());
    if (live) {
      // O += P V, P from the S accumulators (the C layout of two n-tiles is one A fragment).
      const T* tv = sV + stage * BN * LD;
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          a[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          a[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          a[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          a[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int nd = 0; nd < DP / 16; ++nd) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, tv + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + nd * 16 +
                                   (lane >> 4) * 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_16816<T>(o[mt][2 * nd], a[mt], b[0], b[1]);
            mma_16816<T>(o[mt][2 * nd + 1], a[mt], b[2], b[3]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();  // (no tiles: the Q copies) before this warp's Q rows are reused
  __syncthreads();

  // Normalise into this warp's own Q rows (no other warp reads them), then 16-byte stores.
  T* so = sQ + warp * MT * 16 * LD;
#pragma unroll
  for (int i = 0; i < NR; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
    const int mt = i >> 1, h = i & 1, r = mt * 16 + lane / 4 + 8 * h;
#pragma unroll
    for (int n = 0; n < DP / 8; ++n) {
      *reinterpret_cast<uint32_t*>(so + r * LD + n * 8 + 2 * (lane & 3)) =
          pack2<T>(o[mt][n][2 * h] * inv, o[mt][n][2 * h + 1] * inv);
    }
  }
  __syncwarp();
  T* out = static_cast<T*>(p.out);
  for (int idx = lane; idx < MT * 16 * CH; idx += 32) {
    const int r = idx / CH, c = idx % CH, gr = wr0 + r;
    if (gr >= rows || c * 8 >= p.head_size) continue;
    T* dst =
        out + int64_t(qs + gr / G) * p.o_s_tok + int64_t(kvh * G + gr % G) * p.o_s_head + c * 8;
    const T* src = so + r * LD + c * 8;
    if (vf.out) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) dst[e] = src[e];
    }
  }
}

template <typename T, int DP>
void launch_dp(const AttnParams& p, const VecFlags& vf, int max_query_len, cudaStream_t s) {
  using C = Tile<DP>;
  const int64_t tiles =
      std::max<int64_t>(1, (int64_t(max_query_len) * p.group + C::BM - 1) / C::BM);
  const int64_t ctas = tiles * p.num_seqs * p.num_kv_heads;
  PAGEDKV_CHECK(ctas < (int64_t{1} << 31), "context_attention_fwd: too many query tiles");
  launch_with_smem(prefill_mma_kernel<T, DP>, static_cast<unsigned>(ctas), C::kThreads, C::kSmem, s,
                   "context_attention_fwd", p, vf);
}

// One instantiation per query dtype (prefill_mma_{f16,bf16}.cu) so they compile in parallel.
template <typename T>
void launch_typed(const AttnParams& p, const VecFlags& vf, int max_query_len, cudaStream_t s) {
  switch (p.head_size) {
    case 32: launch_dp<T, 32>(p, vf, max_query_len, s); break;
    case 64: launch_dp<T, 64>(p, vf, max_query_len, s); break;
    case 80: launch_dp<T, 80>(p, vf, max_query_len, s); break;
    case 96: launch_dp<T, 96>(p, vf, max_query_len, s); break;
    case 112: launch_dp<T, 112>(p, vf, max_query_len, s); break;
    case 120:
    case 128: launch_dp<T, 128>(p, vf, max_query_len, s); break;
    case 192: launch_dp<T, 192>(p, vf, max_query_len, s); break;
    default: launch_dp<T, 256>(p, vf, max_query_len, s); break;
  }
}

}  // namespace pagedkv::cuda_ops::prefill
