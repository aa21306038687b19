// Instantiates the Hopper decode for __nv_bfloat16 queries (one file per query dtype so the kernels
// compile in parallel).
#include "ops/cuda/decode_bulk.cuh"

namespace pagedkv::cuda_ops {

void launch_decode_bulk_bf16(const BulkDecodeParams& p, int cache_fp8, dim3 grid, int smem,
                             cudaStream_t s) {
  bulk_decode::launch_typed<__nv_bfloat16>(p, cache_fp8, grid, smem, s);
}

int decode_bulk_binary_version() {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(
          &attr, bulk_decode::decode_bulk_kernel<__nv_bfloat16, kNoFp8, 128, 1>) != cudaSuccess) {
    cudaGetLastError();  // no image for this device: not an error of the caller's
    return 0;
  }
  return attr.binaryVersion;
}

}  // namespace pagedkv::cuda_ops
