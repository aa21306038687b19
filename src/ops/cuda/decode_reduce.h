// The reduction of paged_attention_v2's partitions (decode_reduce.cu).
#pragma once

#include "ops/cuda/attention_params.h"

namespace pagedkv::cuda_ops {

// out[s, h, :] = sum_p w_p * tmp_out[s, h, p, :] / sum_p w_p with
// w_p = exp_sums[s, h, p] * exp(max_logits[s, h, p] - max_p max_logits), all in fp32.
void launch_decode_reduce(const AttnParams& p, DType qdtype, cudaStream_t s);

}  // namespace pagedkv::cuda_ops
