// The merge of two softmax states of one query row over disjoint key sets (cascade attention: a
// shared prefix and a sequence's own suffix), as vLLM's merge_attn_states: each side's
// normalised output weighs by exp(its log-sum-exp - the larger one).
#pragma once

#include <cmath>

namespace pagedkv::cuda_ops {

struct SoftmaxMerge {
  float wp = 0.f, ws = 0.f, sum = 0.f, m = -INFINITY;
  bool nan = false;

  // lp, ls: the two sides' log-sum-exps (natural log); an infinite one (no keys) weighs 0.
  __device__ __forceinline__ SoftmaxMerge(float lp, float ls) {
    lp = isinf(lp) ? -INFINITY : lp;
    ls = isinf(ls) ? -INFINITY : ls;
    nan = isnan(lp) || isnan(ls);
    m = fmaxf(lp, ls);
    if (!nan && m != -INFINITY) {
      wp = __expf(lp - m);
      ws = __expf(ls - m);
      sum = wp + ws;
    }
  }
  // One element of the merged output from the two sides' elements p and s.
  __device__ __forceinline__ float operator()(float p, float s) const {
    return nan ? NAN : sum > 0.f ? (wp * p + ws * s) / sum : 0.f;
  }
  // The merged row's log-sum-exp.
  __device__ __forceinline__ float lse() const {
    return nan ? NAN : sum > 0.f ? m + logf(sum) : -INFINITY;
  }
};

}  // namespace pagedkv::cuda_ops
