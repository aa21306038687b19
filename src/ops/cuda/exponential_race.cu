// sample_exponential_race on the GPU: one CTA per row; each thread keeps the best
// probs / E(key, v) of its strided tokens (the noise is computed in registers, never stored),
// then a block argmax (ties to the lowest index, as the CPU kernel's sequential scan).
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/sampling_ops.h"
#include "ops/race_noise.h"

namespace pagedkv::cuda_ops {
namespace {

constexpr int kThreads = 512;

struct RaceParams {
  int64_t* tokens;
  int64_t tokens_s;
  const float* probs;
  int64_t probs_s0, n;
  const float* thresholds;
  const int64_t* keys;
};

// The better of two (score, index) candidates: higher score, then lower index; index -1 = none.
__device__ __forceinline__ bool better(float s, int64_t i, float best_s, int64_t best_i) {
  if (i < 0) return false;
  if (best_i < 0) return true;
  return s > best_s || (s == best_s && i < best_i);
}

__global__ void __launch_bounds__(kThreads) race_kernel(RaceParams prm) {
  __shared__ float warp_score[kThreads / 32];
  __shared__ int64_t warp_index[kThreads / 32];
  const int64_t row = blockIdx.x;
  const float* p = prm.probs + row * prm.probs_s0;
  const float thr = prm.thresholds[row];
  const auto key = static_cast<uint64_t>(prm.keys[row]);
  float best_s = -1.0f;
  int64_t best_i = -1;
  for (int64_t v = threadIdx.x; v < prm.n; v += blockDim.x) {
    const float pv = p[v];
    if (!(pv >= thr)) continue;
    const float s = pv / ops::race::exponential(key, static_cast<uint64_t>(v));
    if (better(s, v, best_s, best_i)) {
      best_s = s;
      best_i = v;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float s = __shfl_xor_sync(0xffffffffu, best_s, o);
    const int64_t i = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (better(s, i, best_s, best_i)) {
      best_s = s;
      best_i = i;
    }
  }
  if (threadIdx.x % 32 == 0) {
    warp_score[threadIdx.x / 32] = best_s;
    warp_index[threadIdx.x / 32] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) {
      if (better(warp_score[w], warp_index[w], best_s, best_i)) {
        best_s = warp_score[w];
        best_i = warp_index[w];
      }
    }
    prm.tokens[row * prm.tokens_s] = best_i < 0 ? 0 : best_i;
  }
}

}  // namespace

void sample_exponential_race(const TensorView& tokens, const TensorView& probs,
                             const TensorView& thresholds, const TensorView& keys,
                             Stream stream) {
  const RaceParams prm{tokens.data_as<int64_t>(), tokens.stride(0),
                       probs.data_as<const float>(), probs.stride(0), probs.size(1),
                       thresholds.data_as<const float>(), keys.data_as<const int64_t>()};
  DeviceGuard guard(probs.device());
  const cudaStream_t s = op_stream(stream, probs.device());
  race_kernel<<<static_cast<unsigned>(probs.size(0)), kThreads, 0, s>>>(prm);
  check_launch("sample_exponential_race");
}

}  // namespace pagedkv::cuda_ops
