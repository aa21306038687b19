// top_k_top_p_threshold on the GPU: one CTA per row runs the radix search of threshold_search.h.
// Each pass sweeps the row once into a 256-bin shared-memory histogram (counts, and 2^-32
// fixed-point masses for top-p: integer sums, so the thresholds are exact and equal to the CPU
// kernel's); thread 0 picks the bin and the CTA descends into it. Most of a vocabulary's
// probabilities share a few bins of the first pass, so a warp first merges its lanes by bin
// (__match_any_sync, then a warp reduction of the group's masses) and one lane per bin adds the
// group's count and mass: at most one atomic per warp and bin instead of 32 colliding ones.
// Later passes skip the warps whose 32 values are all outside the range.
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/sampling_ops.h"
#include "ops/threshold_search.h"

namespace pagedkv::cuda_ops {
namespace {

namespace th = ops::threshold;
using u64 = unsigned long long;

constexpr int kThreads = 512;

struct ThresholdParams {
  float* out;
  int64_t out_s;
  const float* probs;
  int64_t probs_s0, n;
  const int32_t* top_k;
  const float* top_p;
  const float* min_p;
};

struct Shared {
  uint32_t count[th::kBins];
  u64 mass[th::kBins];
  u64 stage[kThreads / 32][32];  // each lane's mass, summed by its bin group's leader
  u64 partial_u64[kThreads / 32];
  float partial_f[kThreads / 32];
  int chosen;
  int64_t remaining;
  u64 above;
};

// The sum of `mass` over the lanes of `peers` (a __match_any_sync group; every lane of the warp
// calls this with its own group). A mass is < 2^33, so its 16-bit halves sum over 32 lanes in
// 32 bits: two hardware reductions (sm_80+); older GPUs go through shared memory.
__device__ __forceinline__ u64 group_sum(unsigned peers, uint64_t mass, u64* stage, int lane) {
#if __CUDA_ARCH__ >= 800
  (void)stage;
  (void)lane;
  const auto hi = static_cast<unsigned>(mass >> 16), lo = static_cast<unsigned>(mass & 0xffffu);
  return (static_cast<u64>(__reduce_add_sync(peers, hi)) << 16) + __reduce_add_sync(peers, lo);
#else
  stage[lane] = mass;
  __syncwarp();
  u64 sum = 0;
  for (unsigned rest = peers; rest; rest &= rest - 1) sum += stage[__ffs(rest) - 1];
  __syncwarp();
  return sum;
#endif
}

// The histogram of the keys of `p` in the search's range (masses too when `with_mass`).
__device__ void histogram(Shared& sh, const float* p, int64_t n, const th::Search& s,
                          bool with_mass) {
  for (int i = threadIdx.x; i < th::kBins; i += blockDim.x) {
    sh.count[i] = 0;
    sh.mass[i] = 0;
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // Whole warps iterate together (n rounded up to 32; the padding lanes hold no element).
  const int64_t padded = (n + 31) / 32 * 32;
  for (int64_t i = threadIdx.x; i < padded; i += blockDim.x) {
    const float v = i < n ? p[i] : 0.0f;
    const uint32_t key = th::key_of(v);
    const int bin = i < n && s.in_range(key) ? s.bin(key) : -1;
    if (__all_sync(0xffffffffu, bin < 0)) continue;  // later passes: most of the row is out
    const unsigned peers = __match_any_sync(0xffffffffu, bin);
    u64 group_mass = 0;
    if (with_mass) group_mass = group_sum(peers, th::mass_of(v), sh.stage[warp], lane);
    if (bin >= 0 && lane == __ffs(peers) - 1) {
      atomicAdd(&sh.count[bin], static_cast<uint32_t>(__popc(peers)));
      if (with_mass) atomicAdd(&sh.mass[bin], group_mass);
    }
  }
  __syncthreads();
}

__device__ u64 block_sum(Shared& sh, u64 v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) sh.partial_u64[threadIdx.x / 32] = v;
  __syncthreads();
  u64 total = 0;
  for (int w = 0; w < kThreads / 32; ++w) total += sh.partial_u64[w];
  __syncthreads();
  return total;
}

__device__ float block_max(Shared& sh, float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) sh.partial_f[threadIdx.x / 32] = v;
  __syncthreads();
  float top = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) top = fmaxf(top, sh.partial_f[w]);
  __syncthreads();
  return top;
}

__device__ uint32_t kth_key(Shared& sh, const float* p, int64_t n, int64_t k) {
  th::Search s;
  if (threadIdx.x == 0) sh.remaining = k;
  for (int pass = 0; pass < th::kPasses; ++pass) {
    histogram(sh, p, n, s, false);
    if (threadIdx.x == 0) sh.chosen = th::pick_kth(sh.count, sh.remaining);
    __syncthreads();
    s.descend(sh.chosen);
    __syncthreads();  // everyone has read `chosen` before the next pass rewrites the bins
  }
  return s.prefix;
}

__device__ uint32_t top_p_key(Shared& sh, const float* p, int64_t n, uint64_t target,
                              uint32_t floor) {
  th::Search s;
  s.floor = floor;
  if (threadIdx.x == 0) sh.above = 0;
  for (int pass = 0; pass < th::kPasses; ++pass) {
    histogram(sh, p, n, s, true);
    if (threadIdx.x == 0) {
      uint64_t above = sh.above;
      sh.chosen =
          th::pick_top_p(sh.count, reinterpret_cast<const uint64_t*>(sh.mass), above, target);
      sh.above = above;
    }
    __syncthreads();
    s.descend(sh.chosen);
    __syncthreads();
  }
  return s.prefix;
}

__global__ void __launch_bounds__(kThreads) threshold_kernel(ThresholdParams prm) {
  __shared__ Shared sh;
  const int64_t row = blockIdx.x;
  const float* p = prm.probs + row * prm.probs_s0;
  const int64_t n = prm.n;
  const int64_t k = prm.top_k[row];
  const float top_p = prm.top_p[row], min_p = prm.min_p[row];
  const bool use_k = k > 0 && k < n;
  const uint32_t k_key = use_k ? kth_key(sh, p, n, k) : 0;
  float threshold = use_k ? th::value_of(k_key) : 0.0f;
  if (top_p < 1.0f) {
    u64 kept = 0;  // mass of the top-k set
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      if (th::key_of(p[i]) >= k_key) kept += th::mass_of(p[i]);
    kept = block_sum(sh, kept);
    const uint64_t target = th::top_p_target(top_p, kept);
    threshold = fmaxf(threshold, th::value_of(top_p_key(sh, p, n, target, k_key)));
  }
  if (min_p > 0.0f) {
    float top = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) top = fmaxf(top, p[i]);
    threshold = fmaxf(threshold, min_p * block_max(sh, top));
  }
  if (threadIdx.x == 0) prm.out[row * prm.out_s] = threshold;
}

}  // namespace

void top_k_top_p_threshold(const TensorView& thresholds, const TensorView& probs,
                           const TensorView& top_k, const TensorView& top_p,
                           const TensorView& min_p, Stream stream) {
  const ThresholdParams prm{thresholds.data_as<float>(),
                            thresholds.stride(0),
                            probs.data_as<const float>(),
                            probs.stride(0),
                            probs.size(1),
                            top_k.data_as<const int32_t>(),
                            top_p.data_as<const float>(),
                            min_p.data_as<const float>()};
  DeviceGuard guard(probs.device());
  const cudaStream_t s = op_stream(stream, probs.device());
  threshold_kernel<<<static_cast<unsigned>(probs.size(0)), kThreads, 0, s>>>(prm);
  check_launch("top_k_top_p_threshold");
}

}  // namespace pagedkv::cuda_ops
