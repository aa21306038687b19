// Instantiates the wgmma prefill kernels for __nv_bfloat16 queries (one file per query dtype so
// they compile in parallel), and the check that the build carries their sm_90a code.
#include "ops/cuda/prefill_wgmma_launch.cuh"

namespace pagedkv::cuda_ops::prefill_wg {

void launch_bf16(const WgParams& wp, int max_query_len, cudaStream_t s) {
  launch_typed<__nv_bfloat16>(wp, max_query_len, s);
}

bool has_sm90a_code() { return has_code_for<__nv_bfloat16, 128>(); }

}  // namespace pagedkv::cuda_ops::prefill_wg
