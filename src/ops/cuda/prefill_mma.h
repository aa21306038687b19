// Tensor-core prefill kernel (prefill_mma.cu): fp16/bf16 queries with an unquantised cache.
#pragma once

#include "ops/cuda/attention_params.h"

namespace pagedkv::cuda_ops {

bool prefill_mma_supported(const AttnParams& p, DType qdtype, KVCacheDType cache);
void launch_prefill_mma(const AttnParams& p, DType qdtype, int max_query_len, cudaStream_t s);

}  // namespace pagedkv::cuda_ops
