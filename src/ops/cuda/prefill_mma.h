// Tensor-core prefill kernel (prefill_mma_kernel.cuh): fp16/bf16 queries with an unquantised cache,
// all head sizes that are multiples of 8 up to 256.
#pragma once

#include "ops/cuda/attention_params.h"

namespace pagedkv::cuda_ops {

// False also when PAGEDKV_PREFILL_MMA=0 (every prefill on the CUDA-core kernel).
bool prefill_mma_supported(const AttnParams& p, DType qdtype, KVCacheDType cache);
void launch_prefill_mma(const AttnParams& p, DType qdtype, int max_query_len, cudaStream_t s);

namespace prefill {

// Which operands can be moved with 16-byte copies (decided on the host, uniform per launch).
struct VecFlags {
  bool q, out, k_cache, v_cache, fresh;
};

// The flags for this call's operands (prefill_mma.cu).
VecFlags vec_flags(const AttnParams& p);

// Per query dtype (prefill_mma_f16.cu, prefill_mma_bf16.cu).
void launch_f16(const AttnParams& p, const VecFlags& vf, int max_query_len, cudaStream_t s);
void launch_bf16(const AttnParams& p, const VecFlags& vf, int max_query_len, cudaStream_t s);

}  // namespace prefill
}  // namespace pagedkv::cuda_ops
