// Multi-LoRA kernels (BGMV): every token of the step in one launch, each reading its adapter's
// weights through its index. Shrink: one warp per (token, rank row), a K-long dot with
// coalesced loads. Expand: one thread per output column of a tile of tokens, the tile's shrunk
// rows in shared memory, an r-long dot per token added to the output in fp32 and rounded once.
// The variant (include/pagedkv/lora.h) picks the loads and the tile: kPerToken, element-wise
// loads and one token per CTA; kTiled, 16-byte packs where rows are aligned, 8 tokens per
// shrink CTA (a warp's A row pieces loaded once for a run of tokens of one adapter) and up to
// 32 tokens per expand CTA, so an adapter's B rows of the CTA's columns are read from L2 once
// per tile (L1 keeps them for the tile's other tokens of that adapter), not once per token.
#include "ops/cuda/layer_common.cuh"
#include "ops/cuda/lora.h"

namespace pagedkv::cuda_ops {
namespace {

constexpr int kShrinkWarps = 8;           // rank rows per shrink CTA
constexpr int kTiledShrinkTokens = 8;     // tokens per shrink CTA (kTiled)
constexpr int kExpandThreads = 256;       // output columns per expand CTA (kPerToken)
constexpr int kTiledExpandThreads = 128;  // output columns per expand CTA (kTiled)
constexpr int kTiledExpandTokens = 32;    // tokens per expand CTA (kTiled), fewer if wide
constexpr int kExpandSmem = 48 * 1024;    // bytes of shrunk rows per expand CTA
constexpr int kMaxSlices = 8;

struct ShrinkParams {
  float* buf;
  const void* x;
  const void* a;
  const int32_t* idx;
  int64_t buf_stride, x_stride, T, R, K;
};

struct ExpandParams {
  void* out;
  const float* buf;
  const void* b;
  const int32_t* idx;
  int64_t out_stride, buf_stride, T, N, r;
  int tokens;  // per CTA
  int num_slices;
  int64_t slice_end[kMaxSlices];  // exclusive end column of each slice
};

// V: elements per load (16 / sizeof(T) where rows are 16-byte aligned, else 1). TT: tokens per
// CTA; a warp loads each piece of its A row once for the run of the tile's tokens that share
// the adapter (a prefill's tokens), instead of once per token.
template <typename T, int V, int TT>
__global__ void lora_shrink_kernel(ShrinkParams p) {
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * TT;
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kShrinkWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.R) return;
  int32_t l[TT];
  float acc[TT];
  bool any = false;
#pragma unroll
  for (int i = 0; i < TT; ++i) {
    l[i] = t0 + i < p.T ? p.idx[t0 + i] : -1;
    acc[i] = 0.0f;
    any |= l[i] >= 0;
  }
  if (!any) {  // no adapter in the tile (base-model tokens): zeros, without reading x
    if (lane == 0)
      for (int i = 0; i < TT && t0 + i < p.T; ++i) p.buf[(t0 + i) * p.buf_stride + row] = 0.0f;
    return;  // (uniform across the warp: no lane is left in the shuffles below)
  }
  const T* x = static_cast<const T*>(p.x) + t0 * p.x_stride;
  const T* a = static_cast<const T*>(p.a) + row * p.K;
  for (int64_t k = static_cast<int64_t>(lane) * V; k < p.K; k += 32 * V) {
    int32_t loaded = -1;  // the adapter whose A piece av holds (the same for the whole warp)
    float av[V];
#pragma unroll
    for (int i = 0; i < TT; ++i) {
      if (l[i] < 0) continue;
      if (l[i] != loaded) {
        load_pack<T, V>(a + l[i] * p.R * p.K + k, av);
        loaded = l[i];
      }
      float xv[V];
      load_pack<T, V>(x + i * p.x_stride + k, xv);
#pragma unroll
      for (int q = 0; q < V; ++q) acc[i] += xv[q] * av[q];
    }
  }
#pragma unroll
  for (int i = 0; i < TT; ++i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
    if (lane == 0 && t0 + i < p.T) p.buf[(t0 + i) * p.buf_stride + row] = acc[i];
  }
}

template <typename T, int V>
__global__ void lora_expand_kernel(ExpandParams p) {
  extern __shared__ float h[];  // the tile's shrunk rows [tokens, num_slices * r]
  const int64_t width = p.num_slices * p.r;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * p.tokens;
  const int64_t nt = p.T - t0 < p.tokens ? p.T - t0 : p.tokens;
  for (int64_t i = threadIdx.x; i < nt * width; i += blockDim.x)
    h[i] = p.buf[(t0 + i / width) * p.buf_stride + i % width];
  __syncthreads();
  const int64_t n = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (n >= p.N) return;
  int s = 0;
  while (n >= p.slice_end[s]) ++s;
  for (int64_t i = 0; i < nt; ++i) {
    const int32_t l = p.idx[t0 + i];
    if (l < 0) continue;
    const T* b = static_cast<const T*>(p.b) + (l * p.N + n) * p.r;
    const float* hs = h + i * width + s * p.r;
    float acc = 0.0f;
    for (int64_t j = 0; j < p.r; j += V) {
      float bv[V];
      load_pack<T, V>(b + j, bv);
#pragma unroll
      for (int q = 0; q < V; ++q) acc += hs[j + q] * bv[q];
    }
    T* o = static_cast<T*>(p.out) + (t0 + i) * p.out_stride + n;
    *o = from_float<T>(to_float(*o) + acc);
  }
}

}  // namespace

void lora_shrink(const TensorView& buf, const TensorView& x, const TensorView& a,
                 const TensorView& token_lora_indices, Stream stream, ops::LoRAVariant variant) {
  ShrinkParams p{buf.data_as<float>(),
                 x.data(),
                 a.data(),
                 token_lora_indices.data_as<int32_t>(),
                 buf.stride(0),
                 x.stride(0),
                 x.size(0),
                 a.size(1),
                 a.size(2)};
  DeviceGuard guard(x.device());
  const cudaStream_t s = op_stream(stream, x.device());
  const bool tiled = variant == ops::LoRAVariant::kTiled;
  const int tokens = tiled ? kTiledShrinkTokens : 1;
  const dim3 grid(ceil_div(p.T, tokens), ceil_div(p.R, kShrinkWarps));
  const bool packed =
      tiled && p.K % pack_width(x.dtype()) == 0 && rows_aligned(x) && rows_aligned(a);
  dispatch_float(x.dtype(), "lora_shrink", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = static_cast<int>(16 / sizeof(T));
    if (!tiled)
      lora_shrink_kernel<T, 1, 1><<<grid, kShrinkWarps * 32, 0, s>>>(p);
    else if (packed)
      lora_shrink_kernel<T, V, kTiledShrinkTokens><<<grid, kShrinkWarps * 32, 0, s>>>(p);
    else
      lora_shrink_kernel<T, 1, kTiledShrinkTokens><<<grid, kShrinkWarps * 32, 0, s>>>(p);
  });
  check_launch("lora_shrink");
}

void lora_expand(const TensorView& out, const TensorView& buf, const TensorView& b,
                 const TensorView& token_lora_indices, const std::vector<int64_t>& slice_sizes,
                 Stream stream, ops::LoRAVariant variant) {
  ExpandParams p{};
  p.out = out.data();
  p.buf = buf.data_as<const float>();
  p.b = b.data();
  p.idx = token_lora_indices.data_as<const int32_t>();
  p.out_stride = out.stride(0);
  p.buf_stride = buf.stride(0);
  p.T = out.size(0);
  p.N = b.size(1);
  p.r = b.size(2);
  p.num_slices = static_cast<int>(slice_sizes.size());
  int64_t end = 0;
  for (int i = 0; i < p.num_slices; ++i) p.slice_end[i] = end += slice_sizes[i];
  const int64_t row_bytes = static_cast<int64_t>(sizeof(float)) * p.num_slices * p.r;
  PAGEDKV_CHECK(row_bytes <= kExpandSmem, "lora_expand: slices * rank = ", p.num_slices * p.r,
                " exceeds the CUDA kernel's ", kExpandSmem / sizeof(float));
  const bool tiled = variant == ops::LoRAVariant::kTiled;
  p.tokens =
      tiled ? static_cast<int>(std::min<int64_t>(kTiledExpandTokens, kExpandSmem / row_bytes)) : 1;
  const int smem = static_cast<int>(row_bytes * p.tokens);
  const int threads = tiled ? kTiledExpandThreads : kExpandThreads;
  DeviceGuard guard(out.device());
  const cudaStream_t s = op_stream(stream, out.device());
  const dim3 grid(ceil_div(p.T, p.tokens), ceil_div(p.N, threads));
  const bool packed = tiled && p.r % pack_width(b.dtype()) == 0 && rows_aligned(b);
  dispatch_float(out.dtype(), "lora_expand", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = static_cast<int>(16 / sizeof(T));
    if (packed)
      lora_expand_kernel<T, V><<<grid, threads, smem, s>>>(p);
    else
      lora_expand_kernel<T, 1><<<grid, threads, smem, s>>>(p);
  });
  check_launch("lora_expand");
}

}  // namespace pagedkv::cuda_ops
