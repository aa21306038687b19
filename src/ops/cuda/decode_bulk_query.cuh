// The Hopper decode's query side (decode_bulk.cuh): the CTA's query tile [NR][D + 8] in shared
// memory (rows of heads past the group are zeros) and its mma.sync B fragments, kept in registers
// where they fit.
#pragma once

#include "ops/cuda/decode_bulk_shape.cuh"

namespace pagedkv::cuda_ops::bulk_decode {

// Loads the query heads g0 .. g0 + ng - 1 of KV head kvh of sequence seq into the tile at `qs`
// (all threads; ends with a CTA barrier). fp8 caches run fp16 MMAs, which see the queries times
// 2^e with |q| * 2^e in [2^14, 2^15) (exact; a bf16 query may lie outside fp16's range): returns
// that factor (1 otherwise), by which the logits are scaled back. wmax: kWarps floats of shared
// memory for the CTA's largest |query|.
template <typename SH>
__device__ __forceinline__ float load_query_tile(const AttnParams& p, typename SH::MT* qs, int seq,
                                                 int kvh, int g0, int ng, float* wmax) {
  using QT = typename SH::Q;
  using MT = typename SH::MT;
  constexpr int D = SH::D, NR = SH::NR;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int qp = D + 8;
  const QT* qg = static_cast<const QT*>(p.q) + int64_t(seq) * p.q_s_tok;
  // Element idx = threadIdx.x + k * kThreads of the tile, all loaded at once (one load latency).
  constexpr int kQPer = NR * D / kThreads;
  static_assert(NR * D % kThreads == 0);
  float qv[kQPer];
#pragma unroll
  for (int k = 0; k < kQPer; ++k) {
    const int idx = threadIdx.x + k * kThreads, g = idx / D, d = idx - g * D;
    qv[k] = g < ng ? to_float(qg[int64_t(kvh * p.group + g0 + g) * p.q_s_head + d]) : 0.f;
  }
  float qmul = 1.f;
  if constexpr (SH::kFp8) {
    float a = 0.f;
#pragma unroll
    for (int k = 0; k < kQPer; ++k) a = fmaxf(a, fabsf(qv[k]));
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    if (lane == 0) wmax[warp] = a;
    __syncthreads();
    float amax = wmax[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) amax = fmaxf(amax, wmax[w]);
    if (amax > 0.f && amax <= 3.0e38f) {
      int ex = 0;
      frexpf(amax, &ex);
      qmul = ldexpf(1.f, min(max(15 - ex, -120), 120));
    }
  }
#pragma unroll
  for (int k = 0; k < kQPer; ++k) {
    const int idx = threadIdx.x + k * kThreads, g = idx / D, d = idx - g * D;
    qs[g * qp + d] = from_float<MT>(qv[k] * qmul);
  }
  __syncthreads();  // the query tile is complete
  return qmul;
}

// The query tile's B fragments for S^T = K Q^T, in registers where they fit (SH::kQRegs), else
// read from the tile at each use.
template <typename SH>
struct QueryFragments {
  using MT = typename SH::MT;
  static constexpr int KD = SH::KD, NH = SH::kNH;
  const MT* qs;
  int r, q;  // the lane's fragment row / column pair
  uint32_t reg[SH::kQRegs ? KD : 1][NH][2];

  __device__ __forceinline__ QueryFragments(const MT* tile, int lane)
      : qs(tile), r(lane >> 2), q(lane & 3) {
    if constexpr (SH::kQRegs) {
#pragma unroll
      for (int ks = 0; ks < KD; ++ks) {
#pragma unroll
        for (int nh = 0; nh < NH; ++nh) {
          reg[ks][nh][0] = load(ks, nh, 0);
          reg[ks][nh][1] = load(ks, nh, 1);
        }
      }
    }
  }

  // B fragment i of k step ks, column tile nh: head nh * 8 + r at logical k 2q, 2q + 1 (i = 0) and
  // 2q + 8, 2q + 9 (i = 1); with fp8 those are dims 4q..4q+3 of the step (see the K fragments).
  __device__ __forceinline__ uint32_t load(int ks, int nh, int i) const {
    const MT* row = qs + (nh * 8 + r) * (SH::D + 8) + ks * 16;
    return *reinterpret_cast<const uint32_t*>(row + (SH::kFp8 ? 4 * q + 2 * i : 2 * q + 8 * i));
  }
  __device__ __forceinline__ uint32_t get(int ks, int nh, int i) const {
    if constexpr (SH::kQRegs) {
      return reg[ks][nh][i];
    } else {
      return load(ks, nh, i);
    }
  }
};

}  // namespace pagedkv::cuda_ops::bulk_decode
