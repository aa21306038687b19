// Instantiates the tensor-core decode for __half queries (one file per query dtype so the kernels
// compile in parallel).
#include "ops/cuda/decode_mma.cuh"

namespace pagedkv::cuda_ops {

void launch_decode_mma_f16(const MmaDecodeParams& p, int cache_fp8, dim3 grid, int smem,
                           cudaStream_t s) {
  mma_decode::launch_typed<__half>(p, cache_fp8, grid, smem, s);
}

}  // namespace pagedkv::cuda_ops
