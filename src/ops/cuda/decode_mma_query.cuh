// The tensor-core decode's query side and scores (decode_mma.cuh): the CTA's query tile
// [16][k_pitch] (rows past its heads are zeros), its A fragments (in registers up to D = 64), and
// S = Q·Kᵀ (16 x 16) for one chunk on mma.sync m16n8k16.
#pragma once

#include "ops/cuda/decode_mma_shape.cuh"
#include "ops/cuda/mma.cuh"

namespace pagedkv::cuda_ops::mma_decode {

// Loads query heads g0 .. g0 + ng - 1 of KV head kvh of sequence seq into the tile at qs (all
// threads; ends with a CTA barrier).
template <typename SH>
__device__ __forceinline__ void load_query_tile(const MmaDecodeParams& mp, typename SH::Q* qs,
                                                int seq, int kvh, int g0, int ng) {
  using QT = typename SH::Q;
  const AttnParams& p = mp.a;
  const int D = p.head_size;
  const QT* qg = static_cast<const QT*>(p.q) + int64_t(seq) * p.q_s_tok;
  for (int idx = threadIdx.x; idx < 16 * D; idx += kThreads) {
    const int g = idx / D, d = idx - g * D;
    qs[g * mp.k_pitch + d] =
        g < ng ? qg[int64_t(kvh * p.group + g0 + g) * p.q_s_head + d] : from_float<QT>(0.f);
  }
  __syncthreads();
}

// The query tile's A fragments, in registers where they fit (SH::kQRegs), else read from the
// tile at each use (the registers buy a third CTA per SM: kMinCtas).
template <typename SH>
struct QueryFragments {
  using QT = typename SH::Q;
  const QT* qs;
  int k_pitch, lane, D;
  uint32_t reg[SH::kQRegs ? SH::KD : 1][4];

  __device__ __forceinline__ QueryFragments(const QT* tile, int pitch, int ln, int head_size)
      : qs(tile), k_pitch(pitch), lane(ln), D(head_size) {
    if constexpr (SH::kQRegs) {
#pragma unroll
      for (int ks = 0; ks < SH::KD; ++ks) {
        if (ks * 16 < D) ldmatrix_x4(reg[ks], qs + (lane & 15) * k_pitch + ks * 16 + (lane >> 4) * 8);
      }
    }
  }
};

// S = Q·Kᵀ of one chunk from its 16-bit K tile kt: s[nt][e] is row r0 + 8 * (e >> 1), key
// 8 * nt + 2 * (lane % 4) + (e & 1) of the chunk.
template <typename SH>
__device__ __forceinline__ void chunk_scores(const QueryFragments<SH>& qf,
                                             const typename SH::Q* kt, float (&s)[2][4]) {
  using QT = typename SH::Q;
  const int lane = qf.lane, D = qf.D, k_pitch = qf.k_pitch;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
  for (int ks = 0; ks < SH::KD; ++ks) {
    if (ks * 16 < D) {
      uint32_t b[4];
      ldmatrix_x4(b, kt + ((lane & 7) + (lane >> 4) * 8) * k_pitch + ks * 16 + ((lane >> 3) & 1) * 8);
      if constexpr (SH::kQRegs) {
        mma_16816<QT>(s[0], qf.reg[ks], b[0], b[1]);
        mma_16816<QT>(s[1], qf.reg[ks], b[2], b[3]);
      } else {
        uint32_t a[4];
        ldmatrix_x4(a, qf.qs + (lane & 15) * k_pitch + ks * 16 + (lane >> 4) * 8);
        mma_16816<QT>(s[0], a, b[0], b[1]);
        mma_16816<QT>(s[1], a, b[2], b[3]);
      }
    }
  }
}

}  // namespace pagedkv::cuda_ops::mma_decode
