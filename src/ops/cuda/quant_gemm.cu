// The int4 GEMM on the GPU: one CTA per [BM rows of x, 64 output columns] tile. Along K, in
// steps of 32, it loads x's tile and 64 weight rows' 16 packed bytes, dequantises those to the
// compute type in shared memory ((q - zero) * scale of the element's group) and multiplies them
// with gemm_tile's accumulators (tensor cores for fp16 / bf16). The weight is read once per
// row tile at half a byte per element.
#include "ops/cuda/gemm_tile.cuh"
#include "ops/cuda/quant.h"

namespace pagedkv::cuda_ops {
namespace {

using namespace gemm_tile;  // NOLINT: the tile constants and helpers

struct Int4Args {
  void* out;
  int64_t out_stride;
  const void* x;
  int64_t x_stride;
  const uint8_t* qweight;  // [N, K / 2]
  const void* scales;      // [N, K / G]
  const uint8_t* zeros;    // [N, K / G]
  int64_t M, N, K;
  int group_size;
};

template <typename T>
__device__ __forceinline__ void dequantize_tile(T (*dst)[kBK + kPad], const Int4Args& p,
                                                int64_t n0, int64_t k0) {
  const T* scales = static_cast<const T*>(p.scales);
  const int64_t groups = p.K / p.group_size;
  for (int idx = threadIdx.x; idx < kBN * (kBK / 2); idx += kThreads) {
    const int r = idx / (kBK / 2), c = (idx % (kBK / 2)) * 2;
    const int64_t n = n0 + r, k = k0 + c;
    float lo = 0.0f, hi = 0.0f;
    if (n < p.N && k < p.K) {  // K is even and G even: k and k + 1 share a byte and a group
      const uint8_t byte = p.qweight[n * (p.K / 2) + k / 2];
      const int64_t g = n * groups + k / p.group_size;
      const float s = to_float(scales[g]), z = static_cast<float>(p.zeros[g]);
      lo = (static_cast<float>(byte & 0xf) - z) * s;
      hi = (static_cast<float>(byte >> 4) - z) * s;
    }
    dst[r][c] = from_float<T>(lo);
    dst[r][c + 1] = from_float<T>(hi);
  }
}

template <typename T, int BM>
__global__ void __launch_bounds__(kThreads) int4_gemm_kernel(Int4Args p, bool vec) {
  __shared__ __align__(16) Tiles<T> tiles;
  __shared__ float acc_tile[BM][kBN + 4];
  const int64_t m0 = int64_t(blockIdx.x) * BM, n0 = int64_t(blockIdx.y) * kBN;
  const T* x = static_cast<const T*>(p.x);
  auto x_row = [&](int r) -> const T* { return m0 + r < p.M ? x + (m0 + r) * p.x_stride : nullptr; };
  Accumulator<T, BM> acc;
  for (int64_t k0 = 0; k0 < p.K; k0 += kBK) {
    load_tile<T, BM>(tiles.a, x_row, k0, p.K, vec);
    dequantize_tile<T>(tiles.b, p, n0, k0);
    __syncthreads();
    acc.step(tiles);
    __syncthreads();
  }
  acc.store(acc_tile);
  __syncthreads();
  T* out = static_cast<T*>(p.out);
  for (int idx = threadIdx.x; idx < BM * kBN; idx += kThreads) {
    const int r = idx / kBN, c = idx % kBN;
    if (m0 + r < p.M && n0 + c < p.N)
      out[(m0 + r) * p.out_stride + n0 + c] = from_float<T>(acc_tile[r][c]);
  }
}

template <typename T>
void launch(const Int4Args& p, bool vec, cudaStream_t s) {
  // Decode-sized batches take 16-row tiles (less padding), larger ones 64.
  if (p.M <= 16) {
    int4_gemm_kernel<T, 16><<<dim3(ceil_div(p.M, 16), ceil_div(p.N, kBN)), kThreads, 0, s>>>(p, vec);
  } else {
    int4_gemm_kernel<T, 64><<<dim3(ceil_div(p.M, 64), ceil_div(p.N, kBN)), kThreads, 0, s>>>(p, vec);
  }
  check_launch("int4_gemm");
}

}  // namespace

void int4_gemm(const TensorView& out, const TensorView& x, const TensorView& qweight,
               const TensorView& scales, const TensorView& zeros, int group_size, Stream stream) {
  DeviceGuard guard(x.device());
  const cudaStream_t s = op_stream(stream, x.device());
  const Int4Args p{out.data(),   out.stride(0),
                   x.data(),     x.stride(0),
                   qweight.data_as<const uint8_t>(),
                   scales.data(), zeros.data_as<const uint8_t>(),
                   x.size(0),    qweight.size(0),
                   x.size(1),    group_size};
  const int64_t es = static_cast<int64_t>(x.element_size());
  const bool vec = (p.K * es) % 16 == 0 && (p.x_stride * es) % 16 == 0 && aligned16(x.data());
  switch (x.dtype()) {
    case DType::kFloat16:
      return launch<__half>(p, vec, s);
    case DType::kBFloat16:
      return launch<__nv_bfloat16>(p, vec, s);
    default:
      return launch<float>(p, vec, s);
  }
}

}  // namespace pagedkv::cuda_ops
