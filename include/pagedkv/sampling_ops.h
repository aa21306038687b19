// Sampling ops: the truncation thresholds of top-k / top-p / min-p sampling for a whole batch,
// found without sorting the vocabulary. Same contract as ops.h (DLPack arrays as TensorViews,
// validated, CPU or CUDA by device, CUDA work on `stream`, no synchronisation or allocation).
#pragma once

#include "pagedkv/tensor.h"

namespace pagedkv::ops {

// For each row of probs [B, V] (float32 values in [0, 1], e.g. a softmax; rows need not sum to
// 1), writes thresholds[b] (float32) such that sampling keeps exactly the tokens with
// probs >= thresholds[b]:
//   top_k[b] (int32, <= 0 or >= V: off): the k-th largest value (ties at it are all kept);
//   top_p[b] (float32 in (0, 1], 1: off), applied to the top-k-truncated distribution: a token is
//     kept when the mass of the tokens strictly more probable than it is < top_p * (the top-k
//     set's mass), as vLLM's rule: the most probable tokens up to and including the one whose
//     mass reaches top_p (and always the most probable one);
//   min_p[b] (float32 in [0, 1], 0: off): min_p * max(probs[b]);
// the largest of the three (0 when all are off). Masses are summed in 2^-32 fixed point, so the
// result is exact and the same on every device and run. The search is a radix select over the
// values' bits (8 bits a pass): a few passes over each row, no sort.
void top_k_top_p_threshold(const TensorView& thresholds, const TensorView& probs,
                           const TensorView& top_k, const TensorView& top_p,
                           const TensorView& min_p, Stream stream = nullptr);

}  // namespace pagedkv::ops
