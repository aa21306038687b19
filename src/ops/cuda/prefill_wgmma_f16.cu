// Instantiates the wgmma prefill kernels for __half queries (one file per query dtype so they
// compile in parallel).
#include "ops/cuda/prefill_wgmma_launch.cuh"

namespace pagedkv::cuda_ops::prefill_wg {

void launch_f16(const WgParams& wp, int max_query_len, cudaStream_t s) {
  launch_typed<__half>(wp, max_query_len, s);
}

}  // namespace pagedkv::cuda_ops::prefill_wg
