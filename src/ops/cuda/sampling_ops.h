// CUDA versions of the sampling ops (include/pagedkv/sampling_ops.h); called by the dispatcher
// (src/ops/sampling_ops.cpp) after validation, for CUDA arrays only.
#pragma once

#include "pagedkv/sampling_ops.h"

namespace pagedkv::cuda_ops {

void top_k_top_p_threshold(const TensorView& thresholds, const TensorView& probs,
                           const TensorView& top_k, const TensorView& top_p,
                           const TensorView& min_p, Stream stream);

void sample_exponential_race(const TensorView& tokens, const TensorView& probs,
                             const TensorView& thresholds, const TensorView& keys, Stream stream);

}  // namespace pagedkv::cuda_ops
