// Online softmax over one S tile of the tensor-core prefill kernel (prefill_mma_kernel.cuh).
#pragma once

#include "ops/cuda/attention_params.h"
#include "ops/cuda/prefill_tile.cuh"

namespace pagedkv::cuda_ops::prefill {

constexpr float kLog2e = 1.4426950408889634f;

// How much per-element work a tile's scores need (warp-uniform):
//  - kPlain: the tile is wholly visible to every row and there is no soft-cap / alibi: raw
//    scores, the softmax scale folded into the exponent's FMA;
//  - kPositions: the same, but some keys fall outside a row's causal range or window: those
//    scores become -inf (an integer compare per element);
//  - kGeneral: soft-cap, alibi or a scale the fold cannot take: every score is scaled, capped,
//    biased and masked one by one.
// The H100 profile of 32 x 512-token prefills spent a third of the consumers' time in one
// general path for the diagonal tiles (soft-cap's tanhf and its branches for every element even
// with soft-cap off); kPositions is what causal tiles need.
enum class TileKind { kPlain, kPositions, kGeneral };

// The last key position packed row gr (of `rows` = query tokens x group) sees: its own position
// when causal, else the sequence's last (non-causal prefill of encoders).
__device__ __forceinline__ int last_key(const AttnParams& p, int ctx, int gr, int rows) {
  return ctx + (p.causal ? gr : rows - 1) / p.group;
}

// Turns this warp's S accumulators s (MT m16 tiles x BN keys from kt; thread rows i = 2 * mt + h at
// wr0 + mt * 16 + lane / 4 + 8 * h) into unnormalised probabilities in place, and updates the
// running row maxima m (log2 domain) and partial row sums l (this thread's columns only; reduced
// over the quad at the end). alpha receives the factor the output rows must be rescaled by.
template <int MT, int BN>
__device__ __forceinline__ void online_softmax(float (&s)[MT][BN / 8][4], float (&m)[2 * MT],
                                               float (&l)[2 * MT], float (&alpha)[2 * MT],
                                               TileKind kind, const AttnParams& p, int kt, int wr0,
                                               int rows, int ctx, int kvh) {
  constexpr int NR = 2 * MT;
  const int lane = threadIdx.x & 31, G = p.group;
  float mx[NR], mul;
  if (kind != TileKind::kGeneral) {
    mul = p.qk_scale * kLog2e;
#pragma unroll
    for (int i = 0; i < NR; ++i) mx[i] = -INFINITY;
    if (kind == TileKind::kPositions) {
      // Column c = n * 8 + (e & 1) of this thread is key kt + 2 * (lane & 3) + c: visible to row i
      // when lo[i] < c <= hi[i] (constant c against per-row bounds: one compare each).
      int hi[NR], lo[NR];
#pragma unroll
      for (int i = 0; i < NR; ++i) {
        const int gr = wr0 + (i >> 1) * 16 + lane / 4 + 8 * (i & 1);
        hi[i] = last_key(p, ctx, gr, rows) - kt - 2 * (lane & 3);
        lo[i] = p.window > 0 ? hi[i] - p.window : -(1 << 30);
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = 2 * mt + (e >> 1), c = n * 8 + (e & 1);
            if (c > hi[i] || c <= lo[i]) s[mt][n][e] = -INFINITY;
          }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          mx[2 * mt + (e >> 1)] = fmaxf(mx[2 * mt + (e >> 1)], s[mt][n][e]);
#pragma unroll
    for (int i = 0; i < NR; ++i) mx[i] = fmaxf(m[i], mx[i] * mul);
  } else {
    mul = 1.f;
    // Row positions and alibi slopes, recomputed per masked tile: registers are scarce.
    int q_pos[NR], last[NR];
    float slope[NR];
#pragma unroll
    for (int i = 0; i < NR; ++i) {
      mx[i] = m[i];
      const int gr = wr0 + (i >> 1) * 16 + lane / 4 + 8 * (i & 1);
      q_pos[i] = ctx + gr / G;
      last[i] = last_key(p, ctx, gr, rows);
      slope[i] = p.alibi != nullptr && gr < rows ? p.alibi[kvh * G + gr % G] : 0.f;
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 2 * mt + (e >> 1), key = kt + n * 8 + 2 * (lane & 3) + (e & 1);
          float x = s[mt][n][e] * p.qk_scale;
          if (p.softcap > 0.f) x = p.softcap * tanhf(x / p.softcap);
          x = (x + slope[i] * float(key - q_pos[i])) * kLog2e;
          const bool masked = key > last[i] || (p.window > 0 && key <= q_pos[i] - p.window);
          s[mt][n][e] = masked ? -INFINITY : x;
          mx[i] = fmaxf(mx[i], s[mt][n][e]);
        }
  }
  float ms[NR];
#pragma unroll
  for (int i = 0; i < NR; ++i) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    ms[i] = mx[i] == -INFINITY ? 0.f : mx[i];  // no row key visible yet: keep zeros
    alpha[i] = fast_exp2(m[i] - ms[i]);
    m[i] = mx[i];
    l[i] *= alpha[i];
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < BN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 2 * mt + (e >> 1);
        s[mt][n][e] = fast_exp2(fmaf(s[mt][n][e], mul, -ms[i]));
        l[i] += s[mt][n][e];
      }
}

}  // namespace pagedkv::cuda_ops::prefill
