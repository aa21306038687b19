// Gated activations out[..., d] = act(x[..., :d]) * x[..., d:]: one thread per 16-byte pack of
// the output (single elements where width or alignment do not allow packs), over every row.
#include "ops/cuda/layer_common.cuh"
#include "ops/cuda/layer_ops.h"
#include "ops/layer_rows.h"

namespace pagedkv::cuda_ops {
namespace {

struct ActParams {
  const void* input;
  void* out;
  ops::RowGeometry in_rows, out_rows;
  int64_t packs_per_row;
  int width;  // d
};

template <int ACT>
__device__ __forceinline__ float activate(float x) {
  if constexpr (ACT == int(ops::GatedActivation::kSilu)) {
    return x / (1.0f + expf(-x));
  } else if constexpr (ACT == int(ops::GatedActivation::kGelu)) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  } else {
    const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
  }
}

template <typename T, int V, int ACT>
__global__ void act_and_mul_kernel(ActParams p) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.in_rows.rows * p.packs_per_row) return;
  const int64_t row = idx / p.packs_per_row;
  const int d0 = static_cast<int>(idx % p.packs_per_row) * V;
  const T* x = static_cast<const T*>(p.input) + p.in_rows.offset(row);
  float gate[V], up[V];
  load_pack<T, V>(x + d0, gate);
  load_pack<T, V>(x + p.width + d0, up);
#pragma unroll
  for (int i = 0; i < V; ++i) gate[i] = __fmul_rn(round_to<T>(activate<ACT>(gate[i])), up[i]);
  store_pack<T, V>(static_cast<T*>(p.out) + p.out_rows.offset(row) + d0, gate);
}

template <typename T, int V>
void launch_typed(ops::GatedActivation act, const ActParams& p, cudaStream_t s) {
  const int threads = 256;
  const int64_t n = p.in_rows.rows * p.packs_per_row;
  const dim3 grid(static_cast<unsigned>((n + threads - 1) / threads));
  switch (act) {
    case ops::GatedActivation::kSilu:
      act_and_mul_kernel<T, V, int(ops::GatedActivation::kSilu)><<<grid, threads, 0, s>>>(p);
      break;
    case ops::GatedActivation::kGelu:
      act_and_mul_kernel<T, V, int(ops::GatedActivation::kGelu)><<<grid, threads, 0, s>>>(p);
      break;
    case ops::GatedActivation::kGeluTanh:
      act_and_mul_kernel<T, V, int(ops::GatedActivation::kGeluTanh)><<<grid, threads, 0, s>>>(p);
      break;
  }
}

}  // namespace

void act_and_mul(ops::GatedActivation act, const TensorView& out, const TensorView& input,
                 Stream stream) {
  ActParams p{input.data(), out.data(), ops::row_geometry(input), ops::row_geometry(out), 0,
              static_cast<int>(out.size(-1))};
  // Packs need the up half (at byte offset width * element size) aligned too.
  const bool vec = p.width % pack_width(input.dtype()) == 0 && rows_aligned(input) &&
                   rows_aligned(out);
  DeviceGuard guard(input.device());
  const cudaStream_t s = op_stream(stream, input.device());
  dispatch_float(input.dtype(), "act_and_mul", [&](auto t) {
    using T = decltype(t);
    constexpr int V = 16 / sizeof(T);
    p.packs_per_row = vec ? p.width / V : p.width;
    if (vec) {
      launch_typed<T, V>(act, p, s);
    } else {
      launch_typed<T, 1>(act, p, s);
    }
  });
  check_launch("act_and_mul");
}

}  // namespace pagedkv::cuda_ops
