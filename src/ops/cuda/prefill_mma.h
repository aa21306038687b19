// Tensor-core prefill kernel (prefill_mma_kernel.cuh): fp16/bf16 queries, a cache in the query
// dtype or in fp8 (dequantised into the shared-memory tiles), all head sizes that are multiples of
// 8 up to 256.
#pragma once

#include "ops/cuda/attention_params.h"

namespace pagedkv::cuda_ops {

// nullptr when the kernel covers the call (fp16/bf16 queries, head sizes multiples of 8 up to
// 256, any cache dtype: the query dtype or fp8), else why not.
const char* prefill_mma_uncovered(const AttnParams& p, DType qdtype);
void launch_prefill_mma(const AttnParams& p, DType qdtype, KVCacheDType cache, int max_query_len,
                        cudaStream_t s);

namespace prefill {

// Which operands can be moved with 16-byte copies (decided on the host, uniform per launch), and
// the cache's fp8 kind (kNoFp8: the cache holds the query dtype). A run-time flag, not a template
// parameter: only the cached context's loads differ, so fp8 caches add no instantiations.
struct VecFlags {
  bool q, out, k_cache, v_cache, fresh;
  // fp8 caches with 8-byte runs (k_cache / v_cache) stage: the cached rows' bytes land by
  // cp.async and are widened in shared memory once landed (prefill_tile.cuh, widen_rows), instead
  // of passing through registers at issue time (a load the issuing warp waits for), which only
  // vLLM's value layout (elements strided along d) still does.
  int cache_fp8;
};

// The flags for this call's operands (prefill_mma.cu).
VecFlags vec_flags(const AttnParams& p);

// Per query dtype (prefill_mma_f16.cu, prefill_mma_bf16.cu).
void launch_f16(const AttnParams& p, const VecFlags& vf, int max_query_len, cudaStream_t s);
void launch_bf16(const AttnParams& p, const VecFlags& vf, int max_query_len, cudaStream_t s);

}  // namespace prefill
}  // namespace pagedkv::cuda_ops
