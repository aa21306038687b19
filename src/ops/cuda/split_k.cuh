// The split-K contract every attention kernel follows: which keys a CTA covers (key_range: the
// sliding window, then its partition in split mode), and how the warps' online-softmax states of
// one query head merge into one result, written as the final output (single pass) or, in split
// mode, as the partition's partial output with its exp-sum and max logit (vLLM
// paged_attention_v2's workspace, merged later by decode_reduce.cu).
#pragma once

#include "ops/cuda/attention_params.h"
#include "ops/cuda/common.cuh"

namespace pagedkv::cuda_ops {

// Keys [lo, hi) a CTA attends to for the query at position q_pos: its sliding window and, in
// split mode, partition `part`. False when that partition starts past the query (the CTA then
// writes nothing, as vLLM leaves such partitions untouched).
__device__ __forceinline__ bool key_range(const AttnParams& p, int q_pos, int part, int& lo,
                                          int& hi) {
  lo = p.window > 0 ? max(0, q_pos - p.window + 1) : 0;
  hi = q_pos + 1;
  if (p.partition_size > 0) {
    if (part * p.partition_size >= hi) return false;
    lo = max(lo, part * p.partition_size);
    hi = min(hi, (part + 1) * p.partition_size);
  }
  return true;
}

// Element d of query head h: warp w's maximum logit m_of(w) (log2 domain), sum l_of(w) and
// unnormalised output o_of(w) merge into out * scale. seq indexes the split workspace, out_row
// the output tensor (the query token; the sequence itself in decode).
template <typename QT, int NW, typename MOf, typename LOf, typename OOf>
__device__ __forceinline__ void merge_store(const AttnParams& p, int seq, int out_row, int h,
                                            int part, int d, float scale, MOf m_of, LOf l_of,
                                            OOf o_of) {
  constexpr float kL2e = 1.4426950408889634f;
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < NW; ++w) M = fmaxf(M, m_of(w));
  float L = 0.f, O = 0.f;
  if (M != -INFINITY) {
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      const float a = exp2f(m_of(w) - M);
      L += l_of(w) * a;
      O += o_of(w) * a;
    }
  }
  const float out = L > 0.f ? O / L * scale : 0.f;
  if (p.partition_size > 0) {
    const int64_t ml = (int64_t(seq) * p.num_heads + h) * p.max_parts + part;
    if (p.tmp_f32) {
      static_cast<float*>(p.tmp_out)[ml * p.head_size + d] = out;
    } else {
      static_cast<QT*>(p.tmp_out)[ml * p.head_size + d] = from_float<QT>(out);
    }
    if (d == 0) {
      p.exp_sums[ml] = L;
      p.max_logits[ml] = M == -INFINITY ? -INFINITY : M / kL2e;
    }
  } else {
    static_cast<QT*>(p.out)[int64_t(out_row) * p.o_s_tok + int64_t(h) * p.o_s_head + d] =
        from_float<QT>(out);
  }
}

}  // namespace pagedkv::cuda_ops
