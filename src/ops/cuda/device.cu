// CUDA runtime queries that must not throw or abort when no driver or GPU is present
// (CI machines build the CUDA sources but have no GPU), and the cached device properties of
// device_props.h.
#include <cuda_runtime.h>

#include "ops/cuda/common.cuh"
#include "ops/cuda/device_props.h"

namespace pagedkv {

int cuda_device_count_impl() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error so later calls start clean
    return 0;
  }
  return count;
}

namespace cuda_ops {
namespace {

// attr of `device` (every cached attribute is positive).
int cached_attribute(std::atomic<int> (&cache)[kMaxCachedDevices], cudaDeviceAttr attr,
                     int device) {
  return cached_per_device(cache, device, [&] {
    int v = 0;
    check_cuda(cudaDeviceGetAttribute(&v, attr, device), "cudaDeviceGetAttribute");
    return v;
  });
}

std::atomic<int> g_sms[kMaxCachedDevices], g_major[kMaxCachedDevices];

}  // namespace

int current_device() {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  return dev;
}

int sm_count(int device) { return cached_attribute(g_sms, cudaDevAttrMultiProcessorCount, device); }

int compute_major(int device) {
  return cached_attribute(g_major, cudaDevAttrComputeCapabilityMajor, device);
}

bool decode_pdl() { return compute_major(current_device()) >= 9; }

}  // namespace cuda_ops
}  // namespace pagedkv
