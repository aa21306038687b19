// RMSNorm and residual-add + RMSNorm: one CTA per row. Pass 1 sums the squares (the fused form
// first writes residual = input + residual), a block reduction gives 1 / rms, pass 2 re-reads
// the row (from L1 / L2) and writes the normalised values. 16-byte packs where the width and
// alignment allow, single elements otherwise.
#include "ops/cuda/layer_common.cuh"
#include "ops/cuda/layer_ops.h"
#include "ops/layer_rows.h"

namespace pagedkv::cuda_ops {
namespace {

struct NormParams {
  const void* input;
  void* out;       // rms_norm: the result; fused: unused (input is written)
  void* residual;  // fused only
  const void* weight;
  ops::RowGeometry in_rows, out_rows, res_rows;
  int width;
  float epsilon, weight_offset;
};

template <typename T, int V>
__device__ __forceinline__ void normalise(float* f, const T* w, float inv, float offset) {
  float wf[V];
  load_pack<T, V>(w, wf);
#pragma unroll
  for (int i = 0; i < V; ++i)
    f[i] = offset != 0.0f ? __fmul_rn(__fmul_rn(f[i], inv), offset + wf[i])
                          : __fmul_rn(round_to<T>(__fmul_rn(f[i], inv)), wf[i]);
}

template <typename T, int V, bool kAdd>
__global__ void rms_norm_kernel(NormParams p) {
  const int64_t row = blockIdx.x;
  T* x = const_cast<T*>(static_cast<const T*>(p.input)) + p.in_rows.offset(row);
  T* r = kAdd ? static_cast<T*>(p.residual) + p.res_rows.offset(row) : nullptr;
  T* out = kAdd ? x : static_cast<T*>(p.out) + p.out_rows.offset(row);
  const T* w = static_cast<const T*>(p.weight);
  const int packs = p.width / V;
  float sum_sq = 0.0f;
  for (int v = threadIdx.x; v < packs; v += blockDim.x) {
    float f[V];
    load_pack<T, V>(x + v * V, f);
    if constexpr (kAdd) {
      float g[V];
      load_pack<T, V>(r + v * V, g);
#pragma unroll
      for (int i = 0; i < V; ++i) f[i] = round_to<T>(f[i] + g[i]);
      store_pack<T, V>(r + v * V, f);
    }
#pragma unroll
    for (int i = 0; i < V; ++i) sum_sq += f[i] * f[i];
  }
  const float inv = rsqrtf(block_sum(sum_sq) / static_cast<float>(p.width) + p.epsilon);
  const T* src = kAdd ? r : x;
  for (int v = threadIdx.x; v < packs; v += blockDim.x) {
    float f[V];
    load_pack<T, V>(src + v * V, f);
    normalise<T, V>(f, w + v * V, inv, p.weight_offset);
    store_pack<T, V>(out + v * V, f);
  }
}

template <bool kAdd>
void launch(const NormParams& p, const TensorView& input, bool vec, Stream stream,
            const char* what) {
  DeviceGuard guard(input.device());
  const cudaStream_t s = op_stream(stream, input.device());
  dispatch_float(input.dtype(), what, [&](auto t) {
    using T = decltype(t);
    constexpr int V = 16 / sizeof(T);
    const int packs = vec ? p.width / V : p.width;
    const int threads = std::min(1024, std::max(32, (packs + 31) / 32 * 32));
    const dim3 grid(static_cast<unsigned>(p.in_rows.rows));
    if (vec) {
      rms_norm_kernel<T, V, kAdd><<<grid, threads, 0, s>>>(p);
    } else {
      rms_norm_kernel<T, 1, kAdd><<<grid, threads, 0, s>>>(p);
    }
  });
  check_launch(what);
}

}  // namespace

void rms_norm(const TensorView& out, const TensorView& input, const TensorView& weight,
              float epsilon, float weight_offset, Stream stream) {
  NormParams p{input.data(), out.data(), nullptr, weight.data(),
               ops::row_geometry(input), ops::row_geometry(out), {},
               static_cast<int>(input.size(-1)), epsilon, weight_offset};
  const bool vec = p.width % pack_width(input.dtype()) == 0 && rows_aligned(input) &&
                   rows_aligned(out) && aligned16(weight.data());
  launch<false>(p, input, vec, stream, "rms_norm");
}

void fused_add_rms_norm(const TensorView& input, const TensorView& residual,
                        const TensorView& weight, float epsilon, float weight_offset,
                        Stream stream) {
  NormParams p{input.data(), nullptr, residual.data(), weight.data(),
               ops::row_geometry(input), {}, ops::row_geometry(residual),
               static_cast<int>(input.size(-1)), epsilon, weight_offset};
  const bool vec = p.width % pack_width(input.dtype()) == 0 && rows_aligned(input) &&
                   rows_aligned(residual) && aligned16(weight.data());
  launch<true>(p, input, vec, stream, "fused_add_rms_norm");
}

}  // namespace pagedkv::cuda_ops
