// The tensor-core decode's output accumulation and epilogue (decode_mma.cuh): O += P·V for one
// chunk (P from the score accumulators, kept in registers as the A operand), and the warps'
// states merged through shared memory into the CTA's result (the final output, or in split mode
// the partition's partial output with its max logit and exp-sum, vLLM paged_attention_v2).
#pragma once

#include "ops/cuda/decode_mma_softmax.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/split_k.cuh"

namespace pagedkv::cuda_ops::mma_decode {

// A lane's O accumulators: 8-wide column tile nt of the head dimension, fragment element e (rows
// r0 and r0 + 8).
template <typename SH>
using OutAcc = float[SH::NT][4];

// Rescales O only when some row's maximum grew (alpha is exactly 1 otherwise): after the first
// chunks that is rare, and the rescale is 4 * NT multiplies per lane (the loop is issue-bound).
template <typename SH>
__device__ __forceinline__ void rescale_output(OutAcc<SH>& o, const float (&alpha)[2]) {
  if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
    for (int nt = 0; nt < SH::NT; ++nt) {
      o[nt][0] *= alpha[0];
      o[nt][1] *= alpha[0];
      o[nt][2] *= alpha[1];
      o[nt][3] *= alpha[1];
    }
  }
}

// O += P·V from the chunk's 16-bit V tile vt ([key][d], or [d][key] with mp.v_trans): the S
// fragments of the two key tiles are the A fragment of one k16 step.
template <typename SH>
__device__ __forceinline__ void accumulate_pv(OutAcc<SH>& o, const float (&s)[2][4],
                                              const typename SH::Q* vt, const MmaDecodeParams& mp,
                                              int lane, int D) {
  using QT = typename SH::Q;
  const uint32_t pa[4] = {pack2<QT>(s[0][0], s[0][1]), pack2<QT>(s[0][2], s[0][3]),
                          pack2<QT>(s[1][0], s[1][1]), pack2<QT>(s[1][2], s[1][3])};
#pragma unroll
  for (int np = 0; np < SH::KD; ++np) {
    if (np * 16 < D) {
      uint32_t b[4];
      if (mp.v_trans) {
        ldmatrix_x4(b, vt + (np * 16 + (lane & 7) + (lane >> 4) * 8) * mp.v_pitch +
                           ((lane >> 3) & 1) * 8);
      } else {
        ldmatrix_x4_trans(b, vt + ((lane & 7) + ((lane >> 3) & 1) * 8) * mp.v_pitch + np * 16 +
                                 (lane >> 4) * 8);
      }
      mma_16816<QT>(o[2 * np], pa, b[0], b[1]);
      mma_16816<QT>(o[2 * np + 1], pa, b[2], b[3]);
    }
  }
}

// Merges the warps' (O, softmax state) and stores the CTA's result for query heads
// g0 .. g0 + ng - 1 of KV head kvh; each warp's ring (wbase) holds its [16][D] output in fp32
// for the merge. sm_m / sm_l: kWarps x 16 floats of shared memory each.
template <typename SH>
__device__ __forceinline__ void merge_and_store(const MmaDecodeParams& mp, unsigned char* smem,
                                                unsigned char* wbase, SoftmaxState& st,
                                                const OutAcc<SH>& o, float (&sm_m)[kWarps][16],
                                                float (&sm_l)[kWarps][16], int seq, int kvh,
                                                int g0, int ng, int part) {
  using QT = typename SH::Q;
  const AttnParams& p = mp.a;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r0 = lane >> 2, D = p.head_size;
  st.reduce_sums();
  float* ow = reinterpret_cast<float*>(wbase);
#pragma unroll
  for (int nt = 0; nt < SH::NT; ++nt) {
    if (nt * 8 < D) {
      const int col = nt * 8 + 2 * (lane & 3);
      *reinterpret_cast<float2*>(ow + r0 * D + col) = make_float2(o[nt][0], o[nt][1]);
      *reinterpret_cast<float2*>(ow + (r0 + 8) * D + col) = make_float2(o[nt][2], o[nt][3]);
    }
  }
  if ((lane & 3) == 0) {
    sm_m[warp][r0] = st.m[0];
    sm_m[warp][r0 + 8] = st.m[1];
    sm_l[warp][r0] = st.l[0];
    sm_l[warp][r0 + 8] = st.l[1];
  }
  __syncthreads();

  for (int idx = threadIdx.x; idx < ng * D; idx += kThreads) {
    const int g = idx / D, d = idx - g * D;
    merge_store<QT, kWarps>(
        p, seq, seq, kvh * p.group + g0 + g, part, d, p.v_scale.get(),
        [&](int w) { return sm_m[w][g]; }, [&](int w) { return sm_l[w][g]; },
        [&](int w) {
          return reinterpret_cast<const float*>(smem + mp.q_bytes + w * mp.warp_bytes)[g * D + d];
        });
  }
}

}  // namespace pagedkv::cuda_ops::mma_decode
