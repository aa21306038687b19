// Device properties the launchers consult on every call (queried once per device, then cached:
// a cudaDeviceGetAttribute per launch is measurable next to a 5 us kernel).
#pragma once

#include <atomic>

namespace pagedkv::cuda_ops {

constexpr int kMaxCachedDevices = 64;

// A per-device answer that cannot change while the library is loaded, computed once by
// query() (which must return a nonzero value; 0 marks "not asked yet"). Devices past the cache
// are asked every time.
template <typename Query>
int cached_per_device(std::atomic<int> (&cache)[kMaxCachedDevices], int device, Query query) {
  if (device < 0 || device >= kMaxCachedDevices) return query();
  int v = cache[device].load(std::memory_order_relaxed);
  if (v == 0) {
    v = query();
    cache[device].store(v, std::memory_order_relaxed);
  }
  return v;
}

int current_device();
int sm_count(int device);       // streaming multiprocessors
int compute_major(int device);  // 9 on Hopper

// Whether the decode kernels launch as programmatic dependents of the stream's previous kernel
// (launch_dependent): on compute 9.x, where the prologue then runs under the previous kernel's
// tail (RESULTS.md).
bool decode_pdl();

}  // namespace pagedkv::cuda_ops
