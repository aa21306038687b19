// Instantiates the tensor-core prefill kernels for __half queries (one file per
// query dtype so they compile in parallel).
#include "ops/cuda/prefill_mma_kernel.cuh"

namespace pagedkv::cuda_ops::prefill {

void launch_f16(const AttnParams& p, const VecFlags& vf, int max_query_len, cudaStream_t s) {
  launch_typed<__half>(p, vf, max_query_len, s);
}

}  // namespace pagedkv::cuda_ops::prefill
