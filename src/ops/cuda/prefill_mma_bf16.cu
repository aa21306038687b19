// Instantiates the tensor-core prefill kernels for __nv_bfloat16 queries (one
// file per query dtype so they compile in parallel).
#include "ops/cuda/prefill_mma_kernel.cuh"

namespace pagedkv::cuda_ops::prefill {

void launch_bf16(const AttnParams& p, const VecFlags& vf, int max_query_len, cudaStream_t s) {
  launch_typed<__nv_bfloat16>(p, vf, max_query_len, s);
}

}  // namespace pagedkv::cuda_ops::prefill
