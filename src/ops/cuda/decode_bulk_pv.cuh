// The Hopper decode's output accumulation (decode_bulk.cuh): O^T += V^T P^T for one chunk, with
// head-dimension rows (half the accumulator registers of O = P V for a group of 4, whose 16-row
// tiles would be three quarters padding); fp8 values are converted to f16 pairs in registers.
#pragma once

#include "ops/cuda/decode_bulk_fragments.cuh"

namespace pagedkv::cuda_ops::bulk_decode {

// A lane's O^T accumulators: tile mt of the head dimension, column tile nh, fragment element e.
template <typename SH>
using OutAcc = float[SH::KD][SH::kNH][4];

template <typename SH>
__device__ __forceinline__ void zero_output(OutAcc<SH>& o) {
#pragma unroll
  for (int mt = 0; mt < SH::KD; ++mt) {
#pragma unroll
    for (int nh = 0; nh < SH::kNH; ++nh) {
      o[mt][nh][0] = o[mt][nh][1] = o[mt][nh][2] = o[mt][nh][3] = 0.f;
    }
  }
}

// Rescales O by alpha (SoftmaxState::rescale) when some head's maximum grew in the warp: after
// the first chunks that is rare.
template <typename SH>
__device__ __forceinline__ void rescale_output(OutAcc<SH>& o, const float (&alpha)[SH::kNH][2],
                                               bool grew) {
  if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
    for (int mt = 0; mt < SH::KD; ++mt) {
#pragma unroll
      for (int nh = 0; nh < SH::kNH; ++nh) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][nh][e] *= alpha[nh][e & 1];
      }
    }
  }
}

// O^T += V^T P^T, P^T as SoftmaxState::probabilities' B fragments.
template <typename SH>
__device__ __forceinline__ void accumulate_pv(OutAcc<SH>& o, const ChunkFragments<SH>& frags,
                                              const uint32_t (&pb)[SH::kNH][2]) {
  using MT = typename SH::MT;
  constexpr int KD = SH::KD, NH = SH::kNH, KIND = SH::kKind;
  if constexpr (SH::kFp8) {
    // One transposed ldmatrix serves two tiles (units mt, mt + 1): lane (r, q) gets dims 2r,
    // 2r + 1 of keys 2q, 2q+1 (and 2q+8, 2q+9), regrouped into key pairs: rows r, r + 8 of the
    // tile (out_dim).
#pragma unroll
    for (int mt = 0; mt < KD; mt += 2) {
      uint32_t w[4];
      frags.v(mt / 2, w);
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const uint32_t lo = key_pairs(w[2 * t]), hi = key_pairs(w[2 * t + 1]);
        const uint32_t a[4] = {fp8x2_to_h2<KIND, false>(lo), fp8x2_to_h2<KIND, true>(lo),
                               fp8x2_to_h2<KIND, false>(hi), fp8x2_to_h2<KIND, true>(hi)};
#pragma unroll
        for (int nh = 0; nh < NH; ++nh) mma_16816<MT>(o[mt + t][nh], a, pb[nh][0], pb[nh][1]);
      }
    }
  } else {
#pragma unroll
    for (int mt = 0; mt < KD; ++mt) {
      uint32_t a[4];
      frags.v(mt, a);
#pragma unroll
      for (int nh = 0; nh < NH; ++nh) mma_16816<MT>(o[mt][nh], a, pb[nh][0], pb[nh][1]);
    }
  }
}

}  // namespace pagedkv::cuda_ops::bulk_decode
