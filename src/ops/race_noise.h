// The counter-based exponential noise of sample_exponential_race (include/pagedkv/
// sampling_ops.h), shared by the CPU and CUDA kernels: E(key, v) = -log(1 - U) with U uniform in
// (0, 1) from the SplitMix64 hash of (key, v), i.e. element v of the SplitMix64 stream seeded
// with `key`.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define PAGEDKV_RACE_HD __host__ __device__ __forceinline__
#else
#define PAGEDKV_RACE_HD inline
#endif

namespace pagedkv::ops::race {

PAGEDKV_RACE_HD uint64_t splitmix64(uint64_t key, uint64_t index) {
  uint64_t z = key + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// An Exp(1) draw: W = (top 32 bits + 0.5) / 2^32 in (0, 1) and E = -log1p(-W), precise where
// E is small (W near 0), which is where a draw decides the race.
PAGEDKV_RACE_HD float exponential(uint64_t key, uint64_t index) {
  const auto bits = static_cast<uint32_t>(splitmix64(key, index) >> 32);
  const float w = (static_cast<float>(bits) + 0.5f) * 2.3283064365386963e-10f;  // 2^-32
  return -log1pf(-w);
}

}  // namespace pagedkv::ops::race
