// Sampling ops: the truncation thresholds of top-k / top-p / min-p sampling for a whole batch,
// found without sorting the vocabulary, and the random draw itself. Same contract as ops.h (DLPack arrays as TensorViews,
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

// Draws one token per row of probs [B, V] (float32 >= 0, need not be normalised) among the
// tokens with probs >= thresholds[b] (float32 [B]; 0 keeps all), by the exponential race:
// tokens[b] (int64 [B]) = argmax_v probs[b, v] / E(keys[b], v), which picks v with probability
// proportional to probs[b, v]. E(key, v) ~ Exp(1) is a counter-based draw (SplitMix64 of key and
// v): a row's token depends only on its probabilities and its key (int64 [B]), never on the
// other rows, and no [B, V] noise array is written. Ties go to the lowest index. A row whose
// kept probabilities are all 0 gets its first kept token.
void sample_exponential_race(const TensorView& tokens, const TensorView& probs,
                             const TensorView& thresholds, const TensorView& keys,
                             Stream stream = nullptr);

}  // namespace pagedkv::ops
