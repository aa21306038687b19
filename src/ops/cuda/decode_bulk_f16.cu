// Instantiates the Hopper decode for __half queries (one file per query dtype so the kernels
// compile in parallel).
#include "ops/cuda/decode_bulk.cuh"

namespace pagedkv::cuda_ops {

void launch_decode_bulk_f16(const BulkDecodeParams& p, int cache_fp8, dim3 grid, int smem,
                            cudaStream_t s) {
  bulk_decode::launch_typed<__half>(p, cache_fp8, grid, smem, s);
}

}  // namespace pagedkv::cuda_ops
