// MoE routing on the GPU: topk_softmax (one warp per token) and moe_align_block_size (one CTA
// counts the pairs per expert in shared memory, lays out the padded groups, then scatters).
#include "ops/cuda/common.cuh"
#include "ops/cuda/moe.h"

namespace pagedkv::cuda_ops {
namespace {

constexpr int kWarpsPerCta = 4;
constexpr int kAlignThreads = 1024;

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp per token: the row's probabilities in shared memory, then k rounds of a warp
// arg-max (ties to the lower expert id, as on the CPU).
template <typename T>
__global__ void topk_softmax_kernel(const T* __restrict__ logits, int64_t row_stride,
                                    int64_t tokens, int experts, int k, bool renormalize,
                                    float* __restrict__ weights, int64_t w_s0, int64_t w_s1,
                                    int32_t* __restrict__ ids, int64_t i_s0, int64_t i_s1) {
  extern __shared__ float probs[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerCta + warp;
  if (t >= tokens) return;
  float* p = probs + warp * experts;
  const T* row = logits + t * row_stride;
  float mx = -INFINITY;
  for (int e = lane; e < experts; e += 32) {
    p[e] = to_float(row[e]);
    mx = fmaxf(mx, p[e]);
  }
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int e = lane; e < experts; e += 32) sum += (p[e] = expf(p[e] - mx));
  sum = warp_sum(sum);
  __syncwarp();
  float picked = 0.0f;
  for (int j = 0; j < k; ++j) {
    float best = -1.0f;
    int best_id = experts;
    for (int e = lane; e < experts; e += 32) {
      if (p[e] > best) best = p[e], best_id = e;
    }
    for (int o = 16; o > 0; o /= 2) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, best_id, o);
      if (ob > best || (ob == best && oi < best_id)) best = ob, best_id = oi;
    }
    picked += best / sum;
    if (lane == 0) {
      weights[t * w_s0 + j * w_s1] = best / sum;
      ids[t * i_s0 + j * i_s1] = best_id;
      p[best_id] = -1.0f;  // taken (probabilities are >= 0)
    }
    __syncwarp();
  }
  if (renormalize && lane == 0 && picked > 0.0f) {
    for (int j = 0; j < k; ++j) weights[t * w_s0 + j * w_s1] /= picked;
  }
}

// One CTA: counts[e] pairs per expert -> padded group starts -> sorted_token_ids / expert_ids.
// Pairs land in their group in arrival order (atomics), not necessarily pair order.
__global__ void moe_align_kernel(const int32_t* __restrict__ ids, int64_t s0, int64_t s1, int k,
                                 int64_t pairs, int experts, int block_size,
                                 int32_t* __restrict__ sorted, int64_t sorted_len,
                                 int32_t* __restrict__ expert_ids, int64_t num_blocks,
                                 int32_t* __restrict__ used) {
  extern __shared__ int32_t smem[];
  int32_t* counts = smem;           // [experts]: pairs, later the scatter cursor
  int32_t* starts = smem + experts;  // [experts + 1]: padded group starts
  for (int e = threadIdx.x; e < experts; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < pairs; i += blockDim.x)
    atomicAdd(&counts[ids[(i / k) * s0 + (i % k) * s1]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t acc = 0;
    for (int e = 0; e < experts; ++e) {
      starts[e] = acc;
      acc += (counts[e] + block_size - 1) / block_size * block_size;
    }
    starts[experts] = acc;
    *used = acc;
  }
  __syncthreads();
  for (int64_t r = threadIdx.x; r < sorted_len; r += blockDim.x) sorted[r] = int32_t(pairs);
  for (int64_t b = threadIdx.x; b < num_blocks; b += blockDim.x) expert_ids[b] = -1;
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    for (int b = starts[e] / block_size; b < starts[e + 1] / block_size; ++b) expert_ids[b] = e;
    counts[e] = starts[e];
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int e = ids[(i / k) * s0 + (i % k) * s1];
    sorted[atomicAdd(&counts[e], 1)] = int32_t(i);
  }
}

template <typename T>
void launch_topk(const TensorView& w, const TensorView& ids, const TensorView& g,
                 bool renormalize, cudaStream_t s) {
  const int64_t tokens = g.size(0);
  const int experts = static_cast<int>(g.size(1)), k = static_cast<int>(ids.size(1));
  const int smem = kWarpsPerCta * experts * static_cast<int>(sizeof(float));
  launch_with_smem(topk_softmax_kernel<T>, dim3(ceil_div(tokens, kWarpsPerCta)),
                   dim3(32 * kWarpsPerCta), smem, s, "topk_softmax", g.data_as<const T>(),
                   g.stride(0), tokens, experts, k, renormalize, w.data_as<float>(), w.stride(0),
                   w.stride(1), ids.data_as<int32_t>(), ids.stride(0), ids.stride(1));
}

}  // namespace

void topk_softmax(const TensorView& topk_weights, const TensorView& topk_ids,
                  const TensorView& gating_output, bool renormalize, Stream stream) {
  DeviceGuard guard(gating_output.device());
  const cudaStream_t s = op_stream(stream, gating_output.device());
  switch (gating_output.dtype()) {
    case DType::kFloat16:
      return launch_topk<__half>(topk_weights, topk_ids, gating_output, renormalize, s);
    case DType::kBFloat16:
      return launch_topk<__nv_bfloat16>(topk_weights, topk_ids, gating_output, renormalize, s);
    default:
      return launch_topk<float>(topk_weights, topk_ids, gating_output, renormalize, s);
  }
}

void moe_align_block_size(const TensorView& topk_ids, int num_experts, int block_size,
                          const TensorView& sorted_token_ids, const TensorView& expert_ids,
                          const TensorView& num_tokens_post_pad, Stream stream) {
  DeviceGuard guard(topk_ids.device());
  const cudaStream_t s = op_stream(stream, topk_ids.device());
  const int smem = (2 * num_experts + 1) * static_cast<int>(sizeof(int32_t));
  launch_with_smem(moe_align_kernel, dim3(1), dim3(kAlignThreads), smem, s,
                   "moe_align_block_size", topk_ids.data_as<const int32_t>(), topk_ids.stride(0),
                   topk_ids.stride(1), static_cast<int>(topk_ids.size(1)),
                   topk_ids.size(0) * topk_ids.size(1), num_experts, block_size,
                   sorted_token_ids.data_as<int32_t>(), sorted_token_ids.size(0),
                   expert_ids.data_as<int32_t>(), expert_ids.size(0),
                   num_tokens_post_pad.data_as<int32_t>());
}

}  // namespace pagedkv::cuda_ops
