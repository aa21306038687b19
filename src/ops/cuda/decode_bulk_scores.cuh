// The Hopper decode's scores (decode_bulk.cuh): S^T = K Q^T for one 16-key chunk on mma.sync
// m16n8k16, the 16 keys as rows and the query heads of the KV group as the 8 columns of each
// column tile, the head dimension as the k steps; fp8 keys are converted to f16 pairs in
// registers (the queries were scaled into fp16's range for that: load_query_tile).
#pragma once

#include "ops/cuda/decode_bulk_fragments.cuh"
#include "ops/cuda/decode_bulk_query.cuh"

namespace pagedkv::cuda_ops::bulk_decode {

// Even and odd k steps accumulate apart (two shorter MMA dependency chains): S^T = sa + sb.
template <typename SH>
__device__ __forceinline__ void chunk_scores(const ChunkFragments<SH>& frags,
                                             const QueryFragments<SH>& qf, float (&sa)[SH::kNH][4],
                                             float (&sb)[SH::kNH][4]) {
  using MT = typename SH::MT;
  constexpr int KD = SH::KD, NH = SH::kNH, KIND = SH::kKind;
#pragma unroll
  for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
    for (int e = 0; e < 4; ++e) sa[nh][e] = sb[nh][e] = 0.f;
  }
  auto s_step = [&](int ks, const uint32_t (&a)[4]) {
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
      mma_16816<MT>((ks & 1) ? sb[nh] : sa[nh], a, qf.get(ks, nh, 0), qf.get(ks, nh, 1));
    }
  };
  if constexpr (SH::kFp8) {
    // One ldmatrix serves two k steps: lane (r, q) gets bytes 4q..4q+3 of keys r and r + 8 in
    // units ks and ks + 1, i.e. logical k (2q, 2q+1 | 2q+8, 2q+9) of each step (QueryFragments).
#pragma unroll
    for (int ks = 0; ks < KD; ks += 2) {
      uint32_t w[4];
      frags.k(ks / 2, w);
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const uint32_t a[4] = {
            fp8x2_to_h2<KIND, false>(w[2 * t]), fp8x2_to_h2<KIND, false>(w[2 * t + 1]),
            fp8x2_to_h2<KIND, true>(w[2 * t]), fp8x2_to_h2<KIND, true>(w[2 * t + 1])};
        s_step(ks + t, a);
      }
    }
  } else {
#pragma unroll
    for (int ks = 0; ks < KD; ++ks) {
      uint32_t a[4];
      frags.k(ks, a);
      s_step(ks, a);
    }
  }
}

}  // namespace pagedkv::cuda_ops::bulk_decode
