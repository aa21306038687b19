// Instantiates the wgmma prefill kernels for __half queries (one file per query dtype so they
// compile in parallel).
#include "ops/cuda/prefill_wgmma_launch.cuh"

namespace pagedkv::cuda_ops::prefill_wg {

void launch_f16(const AttnParams& p, const prefill::VecFlags& vf, int max_query_len,
                cudaStream_t s) {
  launch_typed<__half>(p, vf, max_query_len, s);
}

}  // namespace pagedkv::cuda_ops::prefill_wg
