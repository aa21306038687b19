// The Hopper decode's epilogue (decode_bulk.cuh): the warps' states merge through shared memory
// into the CTA's result, written as the final output or, in split mode, as the partition's
// normalised partial output with its max logit and exp-sum (vLLM paged_attention_v2).
#pragma once

#include "ops/cuda/decode_bulk_fragments.cuh"
#include "ops/cuda/decode_bulk_pv.cuh"
#include "ops/cuda/decode_bulk_softmax.cuh"
#include "ops/cuda/split_k.cuh"

namespace pagedkv::cuda_ops::bulk_decode {

// The CTA's static shared memory for the merge (and the queries' largest |value| with fp8).
template <int NR>
struct MergeShared {
  float m[kWarps][NR], l[kWarps][NR];       // each warp's reference maximum and sum per head
  float wmax[kWarps];                       // fp8: each warp's largest |query| (load_query_tile)
  float t[kWarps][NR];                      // each warp's true maximum per head (split mode)
  float a[kWarps][NR], lsum[NR], mmax[NR];  // the merge: warp weights, total sum and maximum
};

// Merges the warps' (O, softmax state) and stores the CTA's result for query heads
// g0 .. g0 + ng - 1 of KV head kvh. Each warp's ring holds its [NR][D] output in fp32 for the
// merge, rows kOutPitch floats apart: the lanes of one store, heads 2q and 2q + 1 for q = 0..3,
// then hit different banks instead of one.
template <typename SH>
__device__ __forceinline__ void merge_and_store(const BulkDecodeParams& bp, unsigned char* smem,
                                                unsigned char* ring, SoftmaxState<SH>& st,
                                                const OutAcc<SH>& o, MergeShared<SH::NR>& sh,
                                                int seq, int kvh, int g0, int ng, int part) {
  using QT = typename SH::Q;
  constexpr int KD = SH::KD, NH = SH::kNH, D = SH::D, kOutPitch = SH::kOutPitch;
  const AttnParams& p = bp.a;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = lane >> 2, q = lane & 3;
  st.reduce_sums();
  float* ow = reinterpret_cast<float*>(ring);
#pragma unroll
  for (int mt = 0; mt < KD; ++mt) {
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int head = nh * 8 + 2 * q + (e & 1);
        ow[head * kOutPitch + out_dim<SH::kFp8>(mt, r + 8 * (e >> 1))] = o[mt][nh][e];
      }
    }
  }
  // Split mode reports each head's true maximum logit (vLLM's max_logits): the lanes' tmax.
  st.reduce_true_max(p.partition_size > 0);
  if (r == 0) {
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        sh.m[warp][nh * 8 + 2 * q + i] = st.m[nh][i];
        sh.l[warp][nh * 8 + 2 * q + i] = st.l[nh][i];
        sh.t[warp][nh * 8 + 2 * q + i] = st.tmax[nh][i];
      }
    }
  }
  __syncthreads();

  // Each head's warp weights once (one thread per head), not per output element: the element
  // loop is then four shared-memory vector loads and FMAs per 4 dimensions, and one store.
  if (threadIdx.x < ng) {
    const int g = threadIdx.x;
    WarpMerge<kWarps> wm([&](int w) { return sh.m[w][g]; }, [&](int w) { return sh.l[w][g]; });
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sh.a[w][g] = wm.weight(w, p.v_scale.get());
    sh.lsum[g] = wm.L;
    sh.mmax[g] = wm.M;
    if (p.partition_size > 0) {  // the exp-sum restated against the true maximum (lazy m)
      float t = sh.t[0][g];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) t = fmaxf(t, sh.t[w][g]);
      if (t > wm.M) {
        sh.lsum[g] = wm.L * fast_exp2(wm.M - t);
        sh.mmax[g] = t;
      }
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < ng * (D / 4); idx += kThreads) {
    const int g = idx / (D / 4), d = 4 * (idx - g * (D / 4));
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float a = sh.a[w][g];
      const float4 x = *reinterpret_cast<const float4*>(
          reinterpret_cast<const float*>(smem + w * bp.warp_bytes) + g * kOutPitch + d);
      v.x += a * x.x;
      v.y += a * x.y;
      v.z += a * x.z;
      v.w += a * x.w;
    }
    store_merged4<QT>(p, seq, seq, kvh * p.group + g0 + g, part, d, v, sh.lsum[g], sh.mmax[g]);
  }
}

}  // namespace pagedkv::cuda_ops::bulk_decode
