// The split-K contract every attention kernel follows: which keys a CTA covers (key_range: the
// sliding window, then its partition in split mode), and how the warps' online-softmax states of
// one query head merge into one result, written as the final output (single pass) or, in split
// mode, as the partition's partial output with its exp-sum and max logit (vLLM
// paged_attention_v2's workspace, merged later by decode_reduce.cu).
#pragma once

#include "ops/cuda/attention_params.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/mma.cuh"

namespace pagedkv::cuda_ops {

// Keys [lo, hi) a CTA attends to for a query whose last visible key is q_pos (its own position,
// or its sequence's last for non-causal prefill, which has no window): its sliding window and, in
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

// Balanced mode (p.work_items != nullptr): work item `item`'s sequence, planned keys [lo, hi) and
// workspace row; false for an unused item (seq -1) or one naming no sequence of the call or a
// row outside the plan (a device plan is not checked on the host).
__device__ __forceinline__ bool plan_item(const AttnParams& p, int item, int& seq, int& lo, int& hi,
                                          int& row) {
  const int4 w = reinterpret_cast<const int4*>(p.work_items)[item];  // kBalancedItemInts = 4
  seq = w.x;
  lo = w.y;
  hi = w.z;
  row = w.w;
  return seq >= 0 && seq < p.num_q && row >= 0 && row < p.plan_items;
}

// A balanced item's keys: its planned range within the query's sliding window and context (the
// planner already keeps to them; the clamp keeps a bad device plan inside the sequence). An empty
// range still writes its (empty) partial, which the merge weighs 0.
__device__ __forceinline__ void plan_key_range(const AttnParams& p, int q_pos, int& lo, int& hi) {
  lo = max(lo, p.window > 0 ? max(0, q_pos - p.window + 1) : 0);
  hi = min(hi, q_pos + 1);
}

// How NW warps' online-softmax states of one query head merge: M, the largest maximum logit
// (log2 domain); L, the warps' sums rescaled to it; a[w], warp w's rescale factor.
template <int NW>
struct WarpMerge {
  float M = -INFINITY, L = 0.f;
  float a[NW];

  template <typename MOf, typename LOf>
  __device__ __forceinline__ WarpMerge(MOf m_of, LOf l_of) {
#pragma unroll
    for (int w = 0; w < NW; ++w) M = fmaxf(M, m_of(w));
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      a[w] = M == -INFINITY ? 0.f : exp2f(m_of(w) - M);
      L += l_of(w) * a[w];
    }
  }
  // The factor on warp w's unnormalised output in the result (normalised, times scale): 0 for a
  // fully masked head (L = 0), NaN where a NaN logit made L NaN (a NaN / infinite cached key).
  __device__ __forceinline__ float weight(int w, float scale) const {
    return L == 0.f ? 0.f : a[w] * scale / L;
  }
};

// Where element d of query head h goes: the output row out_row (the query token; the sequence
// itself in decode), or in split mode the partition's partial output in the workspace row of
// sequence seq, whose exp-sum L and max logit M (log2 domain) the d == 0 caller stores.
template <typename QT>
struct MergedStore {
  const AttnParams& p;
  int64_t row;  // split: (seq, h, part) in exp_sums; else the output offset of (out_row, h)

  __device__ __forceinline__ MergedStore(const AttnParams& p, int seq, int out_row, int h, int part)
      : p(p),
        row(p.partition_size > 0 ? (int64_t(seq) * p.num_heads + h) * p.max_parts + part
                                 : int64_t(out_row) * p.o_s_tok + int64_t(h) * p.o_s_head) {}
  __device__ __forceinline__ void stats(float L, float M) const {
    constexpr float kL2e = 1.4426950408889634f;
    if (p.partition_size > 0) {
      p.exp_sums[row] = L;
      p.max_logits[row] = M == -INFINITY ? -INFINITY : M / kL2e;
    }
  }
  __device__ __forceinline__ void one(int d, float v) const {
    if (p.partition_size <= 0) {
      static_cast<QT*>(p.out)[row + d] = from_float<QT>(v);
    } else if (p.tmp_f32) {
      static_cast<float*>(p.tmp_out)[row * p.head_size + d] = v;
    } else {
      static_cast<QT*>(p.tmp_out)[row * p.head_size + d] = from_float<QT>(v);
    }
  }
  // Elements d .. d + 3: one vector store where the address allows it.
  __device__ __forceinline__ void four(int d, float4 v) const {
    if (p.partition_size > 0 && p.tmp_f32) {
      float* t = static_cast<float*>(p.tmp_out) + row * p.head_size + d;
      if ((reinterpret_cast<uintptr_t>(t) & 15) == 0) {
        *reinterpret_cast<float4*>(t) = v;
        return;
      }
    } else if constexpr (sizeof(QT) == 2) {
      QT* t = p.partition_size > 0 ? static_cast<QT*>(p.tmp_out) + row * p.head_size + d
                                   : static_cast<QT*>(p.out) + row + d;
      if ((reinterpret_cast<uintptr_t>(t) & 7) == 0) {
        *reinterpret_cast<uint2*>(t) = make_uint2(pack2<QT>(v.x, v.y), pack2<QT>(v.z, v.w));
        return;
      }
    }
    one(d, v.x);
    one(d + 1, v.y);
    one(d + 2, v.z);
    one(d + 3, v.w);
  }
};

// Element d of query head h: warp w's maximum logit m_of(w) (log2 domain), sum l_of(w) and
// unnormalised output o_of(w) merge into out * scale. seq indexes the split workspace, out_row
// the output tensor (the query token; the sequence itself in decode).
template <typename QT, int NW, typename MOf, typename LOf, typename OOf>
__device__ __forceinline__ void merge_store(const AttnParams& p, int seq, int out_row, int h,
                                            int part, int d, float scale, MOf m_of, LOf l_of,
                                            OOf o_of) {
  const WarpMerge<NW> wm(m_of, l_of);
  float O = 0.f;
#pragma unroll
  for (int w = 0; w < NW; ++w) O += o_of(w) * wm.a[w];
  const MergedStore<QT> st(p, seq, out_row, h, part);
  st.one(d, wm.L == 0.f ? 0.f : O / wm.L * scale);  // NaN stays NaN (weight())
  if (d == 0) st.stats(wm.L, wm.M);
}

// Elements d .. d + 3 of query head h, already merged (v) from warps whose merge gave L and M.
template <typename QT>
__device__ __forceinline__ void store_merged4(const AttnParams& p, int seq, int out_row, int h,
                                              int part, int d, float4 v, float L, float M) {
  const MergedStore<QT> st(p, seq, out_row, h, part);
  st.four(d, v);
  if (d == 0) st.stats(L, M);
}

}  // namespace pagedkv::cuda_ops
