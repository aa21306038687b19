// CUDA runtime queries that must not throw or abort when no driver or GPU is present
// (CI machines build the CUDA sources but have no GPU).
#include <cuda_runtime.h>

namespace pagedkv {

int cuda_device_count_impl() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error so later calls start clean
    return 0;
  }
  return count;
}

}  // namespace pagedkv
