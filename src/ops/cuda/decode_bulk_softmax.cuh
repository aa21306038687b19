// The Hopper decode's online softmax (decode_bulk.cuh), per query head (a column of S^T) in the
// log2 domain on the accumulator fragments: a chunk's logits (scale, soft-cap, alibi, the key
// range's mask), the running state (reference maximum, sums, the true maximum), and P^T moved
// from the accumulator layout to the B-operand layout of O^T += V^T P^T by two movmatrix
// transposes.
//
// The reference maximum is lazy: it moves only when some logit of a chunk exceeds it by more than
// kSlack. Below that p = 2^(x - m) <= 2^kSlack, well inside fp16 / bf16 and the fp32 sums, so most
// chunks skip the cross-lane reduction (three dependent shuffles per column); m is then at most
// kSlack below the true maximum, which tmax keeps for the split partials' max logits.
#pragma once

#include "ops/cuda/decode_bulk_shape.cuh"
#include "ops/cuda/mma.cuh"

namespace pagedkv::cuda_ops::bulk_decode {

// The logit map of a lane's heads nh * 8 + 2q + i: x = (soft-capped) scaled score in the log2
// domain, plus alibi, -inf outside the CTA's keys.
template <int NH>
struct LogitMap {
  float c_in, c_out;
  bool capped, has_alibi;
  float slope[NH][2];
  int q_pos;

  // qmul: the queries' fp16 factor (load_query_tile), undone here.
  __device__ __forceinline__ LogitMap(const AttnParams& p, float qmul, int kvh, int g0, int ng,
                                      int q, int query_pos)
      : q_pos(query_pos) {
    const float kmul = p.qk_scale * p.k_scale.get() / qmul;
    capped = p.softcap > 0.f;
    c_in = capped ? kmul / p.softcap : 0.f;
    c_out = capped ? p.softcap * kL2e : kmul * kL2e;
    has_alibi = p.alibi != nullptr;
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int g = nh * 8 + 2 * q + i;
        slope[nh][i] = (has_alibi && g < ng) ? p.alibi[kvh * p.group + g0 + g] * kL2e : 0.f;
      }
    }
  }

  // The chunk's logits into s (from the scores sa + sb) and each head's chunk maximum: element e
  // of tile nh is key key0 + r + 8 (e >> 1), head nh * 8 + 2q + (e & 1). Alibi and the range mask
  // (edge: the chunk crosses [k_lo, k_hi)) are warp-uniform branches.
  __device__ __forceinline__ void apply(float (&s)[NH][4], const float (&sb)[NH][4], int key0,
                                        int r, bool edge, int k_lo, int k_hi,
                                        float (&mx)[NH][2]) const {
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
      mx[nh][0] = mx[nh][1] = -INFINITY;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = key0 + r + 8 * (e >> 1);
        const float v = s[nh][e] + sb[nh][e];
        float x = capped ? c_out * tanhf(v * c_in) : v * c_out;
        if (has_alibi) x += slope[nh][e & 1] * float(tok - q_pos);
        if (edge && !(tok >= k_lo && tok < k_hi)) x = -INFINITY;
        s[nh][e] = x;
        mx[nh][e & 1] = fmaxf(mx[nh][e & 1], x);
      }
    }
  }
};

// A lane's running softmax state of its heads nh * 8 + 2q + i.
template <typename SH>
struct SoftmaxState {
  static constexpr int NH = SH::kNH;
  float m[NH][2], l[NH][2], tmax[NH][2];  // reference maximum, lane-partial sums, true maximum

  __device__ __forceinline__ SoftmaxState() {
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
      m[nh][0] = m[nh][1] = -INFINITY;
      tmax[nh][0] = tmax[nh][1] = -INFINITY;
      l[nh][0] = l[nh][1] = 0.f;
    }
  }

  // Moves the reference maximum where a chunk maximum mx passes it by more than kSlack (the whole
  // warp reduces its columns then): alpha rescales what was accumulated against the old one, ms
  // is the maximum the chunk's probabilities are taken against. Returns whether a maximum moved
  // in this lane.
  __device__ __forceinline__ bool rescale(const float (&mx)[NH][2], float (&alpha)[NH][2],
                                          float (&ms)[NH][2]) {
    bool grew = false;
    bool over = false;
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        over |= mx[nh][i] > m[nh][i] + kSlack;
        tmax[nh][i] = fmaxf(tmax[nh][i], mx[nh][i]);
      }
    }
    if (__any_sync(0xffffffffu, over)) {
#pragma unroll
      for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float v = mx[nh][i];
          v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
          v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
          v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
          const float mn = fmaxf(m[nh][i], v);
          ms[nh][i] = mn == -INFINITY ? 0.f : mn;  // nothing unmasked yet: keep zeros, no NaN
          alpha[nh][i] = mn == m[nh][i] ? 1.f : fast_exp2(m[nh][i] - ms[nh][i]);
          grew |= mn != m[nh][i];
          m[nh][i] = mn;
        }
      }
    } else {
#pragma unroll
      for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          ms[nh][i] = m[nh][i] == -INFINITY ? 0.f : m[nh][i];
          alpha[nh][i] = 1.f;
        }
      }
    }
    return grew;
  }

  // The chunk's probabilities 2^(x - ms), added to the sums, as P^T's B fragments (keys 0-7,
  // 8-15) of each column tile.
  __device__ __forceinline__ void probabilities(float (&s)[NH][4], const float (&ms)[NH][2],
                                                const float (&alpha)[NH][2],
                                                uint32_t (&pb)[NH][2]) {
    using MT = typename SH::MT;
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
      float sum[2] = {0.f, 0.f};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nh][e] = fast_exp2(s[nh][e] - ms[nh][e & 1]);
        sum[e & 1] += s[nh][e];
      }
      l[nh][0] = l[nh][0] * alpha[nh][0] + sum[0];  // lane-partial sums
      l[nh][1] = l[nh][1] * alpha[nh][1] + sum[1];
      pb[nh][0] = movmatrix_trans(pack2<MT>(s[nh][0], s[nh][1]));
      pb[nh][1] = movmatrix_trans(pack2<MT>(s[nh][2], s[nh][3]));
    }
  }

  // At the end: each head's sum over the warp's lanes.
  __device__ __forceinline__ void reduce_sums() {
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        l[nh][i] += __shfl_xor_sync(0xffffffffu, l[nh][i], 4);
        l[nh][i] += __shfl_xor_sync(0xffffffffu, l[nh][i], 8);
        l[nh][i] += __shfl_xor_sync(0xffffffffu, l[nh][i], 16);
      }
    }
  }

  // At the end, in split mode: each head's true maximum over the warp's lanes (vLLM's
  // max_logits).
  __device__ __forceinline__ void reduce_true_max(bool split) {
    if (split) {
#pragma unroll
      for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          tmax[nh][i] = fmaxf(tmax[nh][i], __shfl_xor_sync(0xffffffffu, tmax[nh][i], 4));
          tmax[nh][i] = fmaxf(tmax[nh][i], __shfl_xor_sync(0xffffffffu, tmax[nh][i], 8));
          tmax[nh][i] = fmaxf(tmax[nh][i], __shfl_xor_sync(0xffffffffu, tmax[nh][i], 16));
        }
      }
    }
  }
};

}  // namespace pagedkv::cuda_ops::bulk_decode
