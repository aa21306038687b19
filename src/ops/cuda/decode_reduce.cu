// Merges paged_attention_v2's per-partition results with an fp32 log-sum-exp: one CTA per
// (query head, sequence); the partition weights live in shared memory. On compute 9.x it is
// launched as a programmatic dependent of the partition kernel (decode_pdl()), so its launch
// overlaps that kernel's last CTAs instead of following its completion, and it lets the next
// kernel launch the same way.
#include <algorithm>

#include "ops/cuda/bulk_copy.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/decode_reduce.h"
#include "ops/cuda/device_props.h"

namespace pagedkv::cuda_ops {
namespace {

constexpr int kThreads = 128;

template <bool kMax>
__device__ float block_reduce(float v, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = scratch[0];
#pragma unroll
  for (int i = 1; i < kThreads / 32; ++i) r = kMax ? fmaxf(r, scratch[i]) : r + scratch[i];
  __syncthreads();
  return r;
}

template <typename QT, typename TT>
__global__ void __launch_bounds__(kThreads) decode_reduce_kernel(const AttnParams p) {
  extern __shared__ float weights[];  // [most partials of one row: max_parts or plan_items]
  __shared__ float scratch[kThreads / 32];
  const int h = blockIdx.x, seq = blockIdx.y, D = p.head_size;
  // The sequence's partials: n rows `step` apart from `row`. v2: its partitions (seq_lens is an
  // earlier step's input, read before the wait); balanced mode: its work items' rows, clamped
  // into the plan, read after the wait like the partials.
  int n = 0;
  int64_t row = 0, step = 1;
  if (p.seq_offsets == nullptr) {
    const int seq_len = p.seq_lens[seq];
    n = seq_len <= 0 ? 0 : min(p.max_parts, (seq_len + p.partition_size - 1) / p.partition_size);
    row = (int64_t(seq) * p.num_heads + h) * p.max_parts;
  }
  pdl_trigger();  // the next decode may launch now: it waits for this grid before reading
  pdl_wait();     // the partitions' results are complete and visible
  if (p.seq_offsets != nullptr) {
    const int first = min(max(p.seq_offsets[seq], 0), p.plan_items);
    n = min(max(p.seq_offsets[seq + 1], first), p.plan_items) - first;
    row = int64_t(first) * p.num_heads + h;
    step = p.num_heads;
  }

  // A thread's first partition (the only one up to kThreads partitions): its max logit and sum
  // load in one round, before the maximum is known.
  const int i0 = threadIdx.x;
  const float ml0 = i0 < n ? p.max_logits[row + i0 * step] : -INFINITY;
  const float es0 = i0 < n ? p.exp_sums[row + i0 * step] : 0.f;
  float mx = ml0;
  for (int i = i0 + kThreads; i < n; i += kThreads) mx = fmaxf(mx, p.max_logits[row + i * step]);
  mx = block_reduce<true>(mx, scratch);
  auto weight = [&](float ml, float es) { return ml == -INFINITY ? 0.f : es * __expf(ml - mx); };
  float sum = 0.f;
  if (i0 < n) sum = weights[i0] = weight(ml0, es0);
  for (int i = i0 + kThreads; i < n; i += kThreads) {
    weights[i] = weight(p.max_logits[row + i * step], p.exp_sums[row + i * step]);
    sum += weights[i];
  }
  sum = block_reduce<false>(sum, scratch);  // its barrier also publishes `weights`
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  if (p.lse != nullptr && threadIdx.x == 0) {  // for merge_attn_states (cascade attention)
    p.lse[int64_t(h) * p.num_q + seq] = sum > 0.f ? mx + logf(sum) : -INFINITY;
  }
  const TT* tmp = static_cast<const TT*>(p.tmp_out) + row * D;
  QT* out = static_cast<QT*>(p.out) + int64_t(seq) * p.o_s_tok + int64_t(h) * p.o_s_head;
  // Every partition before n was written (a fully masked one as zeros: split_k.cuh), so its
  // partial output is read unconditionally, kUnroll at a time: independent loads, one latency
  // per group instead of one per partition.
  constexpr int kUnroll = 8;
  for (int d = threadIdx.x; d < D; d += kThreads) {
    float o = 0.f;
    int i = 0;
    for (; i + kUnroll <= n; i += kUnroll) {
      float t[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) t[u] = to_float(tmp[(i + u) * step * D + d]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) o += weights[i + u] * t[u];
    }
    for (; i < n; ++i) o += weights[i] * to_float(tmp[i * step * D + d]);
    out[d] = from_float<QT>(o * inv);
  }
}

template <typename QT, typename TT>
void launch_kernel(const AttnParams& p, cudaStream_t s) {
  const int most = p.seq_offsets != nullptr ? p.plan_items : p.max_parts;  // partials per row
  launch_dependent(decode_reduce_kernel<QT, TT>, dim3(p.num_heads, p.num_q), dim3(kThreads),
                   int(sizeof(float) * std::max(1, most)), s, decode_pdl(),
                   "paged_attention_v2 (reduce)", p);
}

template <typename QT>
void launch_typed(const AttnParams& p, cudaStream_t s) {
  if (p.tmp_f32) {
    launch_kernel<QT, float>(p, s);
  } else {
    launch_kernel<QT, QT>(p, s);
  }
}

}  // namespace

void launch_decode_reduce(const AttnParams& p, DType qdtype, cudaStream_t s) {
  switch (qdtype) {
    case DType::kFloat32: launch_typed<float>(p, s); break;
    case DType::kFloat16: launch_typed<__half>(p, s); break;
    default: launch_typed<__nv_bfloat16>(p, s); break;
  }
  check_launch("paged_attention_v2 (reduce)");
}

}  // namespace pagedkv::cuda_ops
