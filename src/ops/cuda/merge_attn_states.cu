// merge_attn_states on the GPU: one CTA per (token, head) row, one thread per element
// (merge_attn_states.cuh holds the merge itself).
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/merge_attn_states.cuh"

namespace pagedkv::cuda_ops {
namespace {

constexpr int kThreads = 128;

struct MergeParams {
  void* out;
  const void* pre;
  const void* suf;
  int64_t o_s0, o_s1, p_s0, p_s1, s_s0, s_s1;  // elements
  const float* lp;
  const float* ls;
  float* lo;  // optional
  int T, D;
};

template <typename T>
__global__ void __launch_bounds__(kThreads) merge_kernel(const MergeParams m) {
  const int t = blockIdx.x, h = blockIdx.y;
  const int64_t r = int64_t(h) * m.T + t;
  const SoftmaxMerge mg(m.lp[r], m.ls[r]);
  const T* p = static_cast<const T*>(m.pre) + t * m.p_s0 + h * m.p_s1;
  const T* s = static_cast<const T*>(m.suf) + t * m.s_s0 + h * m.s_s1;
  T* o = static_cast<T*>(m.out) + t * m.o_s0 + h * m.o_s1;
  for (int d = threadIdx.x; d < m.D; d += kThreads) {
    o[d] = from_float<T>(mg(to_float(p[d]), to_float(s[d])));
  }
  if (m.lo != nullptr && threadIdx.x == 0) m.lo[r] = mg.lse();
}

}  // namespace

void merge_attn_states(const TensorView& output, const std::optional<TensorView>& output_lse,
                       const TensorView& prefix_output, const TensorView& prefix_lse,
                       const TensorView& suffix_output, const TensorView& suffix_lse,
                       Stream stream) {
  DeviceGuard guard(output.device());
  const cudaStream_t s = op_stream(stream, output.device());
  MergeParams m{output.data(),
                prefix_output.data(),
                suffix_output.data(),
                output.stride(0),
                output.stride(1),
                prefix_output.stride(0),
                prefix_output.stride(1),
                suffix_output.stride(0),
                suffix_output.stride(1),
                prefix_lse.data_as<const float>(),
                suffix_lse.data_as<const float>(),
                output_lse ? output_lse->data_as<float>() : nullptr,
                static_cast<int>(output.size(0)),
                static_cast<int>(output.size(2))};
  const dim3 grid(static_cast<unsigned>(output.size(0)), static_cast<unsigned>(output.size(1)));
  switch (output.dtype()) {
    case DType::kFloat32: merge_kernel<float><<<grid, kThreads, 0, s>>>(m); break;
    case DType::kFloat16: merge_kernel<__half><<<grid, kThreads, 0, s>>>(m); break;
    default: merge_kernel<__nv_bfloat16><<<grid, kThreads, 0, s>>>(m); break;
  }
  check_launch("merge_attn_states");
}

}  // namespace pagedkv::cuda_ops
