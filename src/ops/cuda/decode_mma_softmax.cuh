// The tensor-core decode's online softmax (decode_mma.cuh), FlashAttention-style in the log2
// domain on the accumulator fragments: a chunk's logits (scale, soft-cap, alibi, the key range's
// mask) and each row's running maximum and sum. A lane holds rows r0 = lane / 4 and r0 + 8.
#pragma once

#include "ops/cuda/decode_mma_shape.cuh"

namespace pagedkv::cuda_ops::mma_decode {

// The logit map of a lane's rows (query heads g0 + r0 and g0 + r0 + 8).
struct LogitMap {
  float c_in, c_out;
  bool capped, has_alibi;
  float slope[2];
  int q_pos;

  __device__ __forceinline__ LogitMap(const AttnParams& p, int kvh, int g0, int ng, int r0,
                                      int query_pos)
      : q_pos(query_pos) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int g = r0 + 8 * i;
      slope[i] = (p.alibi != nullptr && g < ng) ? p.alibi[kvh * p.group + g0 + g] * kL2e : 0.f;
    }
    const float kmul = p.qk_scale * p.k_scale.get();
    capped = p.softcap > 0.f;
    c_in = capped ? kmul / p.softcap : 0.f;
    c_out = capped ? p.softcap * kL2e : kmul * kL2e;
    has_alibi = p.alibi != nullptr;
  }

  // Logits in the log2 domain, masked, into s, and each row's chunk maximum: s[nt][e] is row
  // r0 + 8 * (e >> 1), key key0 + 8 * nt + 2 * (lane % 4) + (e & 1). Alibi and the range mask
  // (edge: the chunk crosses [k_lo, k_hi)) are warp-uniform branches: most chunks lie inside the
  // range and most models have no alibi.
  __device__ __forceinline__ void apply(float (&s)[2][4], int key0, int lane, bool edge, int k_lo,
                                        int k_hi, float (&mx)[2]) const {
    mx[0] = mx[1] = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = key0 + nt * 8 + 2 * (lane & 3) + (e & 1);
        float x = capped ? c_out * tanhf(s[nt][e] * c_in) : s[nt][e] * c_out;
        if (has_alibi) x += slope[e >> 1] * float(tok - q_pos);
        if (edge && !(tok >= k_lo && tok < k_hi)) x = -INFINITY;
        s[nt][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    }
  }
};

// A lane's running maximum and lane-partial sum of its two rows.
struct SoftmaxState {
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  // One chunk: the row maxima over the lanes of a row, the probabilities 2^(x - m) into s and
  // the sums; alpha rescales what was accumulated against the old maximum (exactly 1 where the
  // maximum did not move: O's rescale checks that).
  __device__ __forceinline__ void update(float (&mx)[2], float (&s)[2][4], float (&alpha)[2]) {
    float ms[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float mn = fmaxf(m[i], mx[i]);
      ms[i] = mn == -INFINITY ? 0.f : mn;  // nothing unmasked yet: keep zeros, no NaN
      alpha[i] = mn == m[i] ? 1.f : exp2f(m[i] - ms[i]);  // exactly 1: see the lazy rescale
      m[i] = mn;
    }
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - ms[e >> 1]);
        sum[e >> 1] += s[nt][e];
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) l[i] = l[i] * alpha[i] + sum[i];  // lane-partial sums
  }

  // At the end: each row's sum over its four lanes.
  __device__ __forceinline__ void reduce_sums() {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
  }
};

}  // namespace pagedkv::cuda_ops::mma_decode
