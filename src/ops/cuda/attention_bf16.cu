// Instantiates the CUDA-core paged attention kernels for __nv_bfloat16 queries (one file per query
// dtype so the kernels compile in parallel).
#include "ops/cuda/attention_kernel.cuh"

namespace pagedkv::cuda_ops {

void launch_attention_bf16(const AttnParams& p, int cache_fp8, cudaStream_t s) {
  launch_attention<__nv_bfloat16>(p, cache_fp8, s);
}

}  // namespace pagedkv::cuda_ops
