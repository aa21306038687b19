// The MoE grouped GEMM on the GPU. One CTA per (block of BM sorted rows of one expert, BN output
// columns): it gathers its rows of `a` (row i / top_k of pair i) and the expert's weight rows
// into shared memory tile by tile along K, multiplies them (fp16 / bf16: tensor cores through
// WMMA 16x16x16 with fp32 accumulators, one 16-column strip per warp; fp32: CUDA cores) and
// writes each pair's row, times its routing weight when given. The grid covers the worst-case
// padded length; CTAs past num_tokens_post_pad (read on the device) return at once, so the
// launch needs no host sync and is CUDA-graph safe.
#include "ops/cuda/gemm_tile.cuh"
#include "ops/cuda/moe.h"

namespace pagedkv::cuda_ops {
namespace {

using namespace gemm_tile;  // NOLINT: the tile constants and helpers

struct GemmArgs {
  void* out;
  int64_t out_stride;
  const void* a;
  int64_t a_stride;
  const void* w;  // [E, N, K] contiguous
  const int32_t* sorted;
  const int32_t* expert_ids;
  const int32_t* used;
  const float* weights;  // [pairs] (contiguous) or nullptr
  int64_t sorted_len, pairs, N, K;
  int top_k;
};

template <typename T, int BM>
__global__ void __launch_bounds__(kThreads) moe_gemm_kernel(GemmArgs p, bool vec) {
  __shared__ int64_t pair_of[BM];  // pair index of each row, -1 for padding
  __shared__ __align__(16) Tiles<T> tiles;
  __shared__ float acc_tile[BM][kBN + 4];
  const int64_t row0 = int64_t(blockIdx.x) * BM;
  const int64_t used = min(int64_t(*p.used), p.sorted_len);
  if (row0 >= used) return;
  const int64_t n0 = int64_t(blockIdx.y) * kBN;
  const int expert = p.expert_ids[blockIdx.x];
  for (int r = threadIdx.x; r < BM; r += kThreads) {
    const int64_t i = row0 + r < used ? p.sorted[row0 + r] : p.pairs;
    pair_of[r] = i >= 0 && i < p.pairs ? i : -1;
  }
  __syncthreads();
  const T* a = static_cast<const T*>(p.a);
  const T* w = static_cast<const T*>(p.w) + int64_t(expert < 0 ? 0 : expert) * p.N * p.K;
  auto a_row = [&](int r) -> const T* {
    return pair_of[r] < 0 ? nullptr : a + (pair_of[r] / p.top_k) * p.a_stride;
  };
  auto w_row = [&](int r) -> const T* { return n0 + r < p.N ? w + (n0 + r) * p.K : nullptr; };

  if (expert >= 0) {
    Accumulator<T, BM> acc;
    for (int64_t k0 = 0; k0 < p.K; k0 += kBK) {
      load_tile<T, BM>(tiles.a, a_row, k0, p.K, vec);
      load_tile<T, kBN>(tiles.b, w_row, k0, p.K, vec);
      __syncthreads();
      acc.step(tiles);
      __syncthreads();
    }
    acc.store(acc_tile);
  } else {  // an expert this rank does not hold: zeros
    for (int idx = threadIdx.x; idx < BM * kBN; idx += kThreads)
      acc_tile[idx / kBN][idx % kBN] = 0.0f;
  }
  __syncthreads();
  T* out = static_cast<T*>(p.out);
  for (int idx = threadIdx.x; idx < BM * kBN; idx += kThreads) {
    const int r = idx / kBN, c = idx % kBN;
    const int64_t i = pair_of[r];
    if (i < 0 || n0 + c >= p.N) continue;
    const float scale = p.weights != nullptr ? p.weights[i] : 1.0f;
    out[i * p.out_stride + n0 + c] = from_float<T>(acc_tile[r][c] * scale);
  }
}

template <typename T>
void launch(const GemmArgs& p, int block_size, int64_t sorted_len, bool vec, cudaStream_t s) {
  const dim3 grid(ceil_div(sorted_len, block_size), ceil_div(p.N, kBN));
  if (grid.x == 0) return;
  switch (block_size) {
    case 16:
      moe_gemm_kernel<T, 16><<<grid, kThreads, 0, s>>>(p, vec);
      break;
    case 32:
      moe_gemm_kernel<T, 32><<<grid, kThreads, 0, s>>>(p, vec);
      break;
    default:
      moe_gemm_kernel<T, 64><<<grid, kThreads, 0, s>>>(p, vec);
      break;
  }
  check_launch("moe_grouped_gemm");
}

}  // namespace

void moe_grouped_gemm(const TensorView& out, const TensorView& a, const TensorView& w,
                      const TensorView& sorted_token_ids, const TensorView& expert_ids,
                      const TensorView& num_tokens_post_pad, int top_k, int block_size,
                      const std::optional<TensorView>& topk_weights, Stream stream) {
  DeviceGuard guard(a.device());
  const cudaStream_t s = op_stream(stream, a.device());
  GemmArgs p{out.data(),
             out.stride(0),
             a.data(),
             a.stride(0),
             w.data(),
             sorted_token_ids.data_as<const int32_t>(),
             expert_ids.data_as<const int32_t>(),
             num_tokens_post_pad.data_as<const int32_t>(),
             topk_weights ? topk_weights->data_as<const float>() : nullptr,
             sorted_token_ids.size(0),
             out.size(0),
             w.size(1),
             w.size(2),
             top_k};
  const int64_t es = static_cast<int64_t>(a.element_size());
  const bool vec = (p.K * es) % 16 == 0 && (a.stride(0) * es) % 16 == 0 && aligned16(a.data()) &&
                   aligned16(w.data());
  const int64_t len = sorted_token_ids.size(0);
  switch (a.dtype()) {
    case DType::kFloat16:
      return launch<__half>(p, block_size, len, vec, s);
    case DType::kBFloat16:
      return launch<__nv_bfloat16>(p, block_size, len, vec, s);
    default:
      return launch<float>(p, block_size, len, vec, s);
  }
}

}  // namespace pagedkv::cuda_ops
