// Rotary position embedding in place on query and key: one CTA per token, its threads over the
// (head, rotated pair) of query then key heads. Products use __fmul_rn so the compiler does not
// contract them into FMAs: the eager reference rounds each product.
#include "ops/cuda/layer_common.cuh"
#include "ops/cuda/layer_ops.h"

namespace pagedkv::cuda_ops {
namespace {

struct RotaryParams {
  const void* positions;
  bool positions64;
  void* query;
  void* key;  // may be null
  int64_t q_s0, q_s1, k_s0, k_s1;
  int q_heads, k_heads;
  const void* cache;  // [max_position, rotary_dim]
  int64_t max_position;
  int half;  // rotary_dim / 2
  bool is_neox;
};

template <typename T, typename CT>
__global__ void rotary_kernel(RotaryParams p) {
  const int64_t t = blockIdx.x;
  const int64_t pos = p.positions64 ? static_cast<const int64_t*>(p.positions)[t]
                                    : static_cast<const int32_t*>(p.positions)[t];
  if (pos < 0 || pos >= p.max_position) return;  // no host check on the GPU: never a wild read
  const CT* cs = static_cast<const CT*>(p.cache) + pos * 2 * p.half;
  const int pairs = (p.q_heads + p.k_heads) * p.half;
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int head = i / p.half, j = i % p.half;
    T* x = head < p.q_heads
               ? static_cast<T*>(p.query) + t * p.q_s0 + head * p.q_s1
               : static_cast<T*>(p.key) + t * p.k_s0 + (head - p.q_heads) * p.k_s1;
    const int i1 = p.is_neox ? j : 2 * j, i2 = p.is_neox ? j + p.half : 2 * j + 1;
    const float c = round_to<T>(to_float(cs[j])), s = round_to<T>(to_float(cs[p.half + j]));
    const float x1 = to_float(x[i1]), x2 = to_float(x[i2]);
    x[i1] = from_float<T>(round_to<T>(__fmul_rn(x1, c)) - round_to<T>(__fmul_rn(x2, s)));
    x[i2] = from_float<T>(round_to<T>(__fmul_rn(x2, c)) + round_to<T>(__fmul_rn(x1, s)));
  }
}

}  // namespace

void rotary_embedding(const TensorView& positions, const TensorView& query,
                      const std::optional<TensorView>& key, const TensorView& cos_sin_cache,
                      bool is_neox, Stream stream) {
  RotaryParams p{};
  p.positions = positions.data();
  p.positions64 = positions.dtype() == DType::kInt64;
  p.query = query.data();
  p.q_s0 = query.stride(0);
  p.q_s1 = query.stride(1);
  p.q_heads = static_cast<int>(query.size(1));
  if (key) {
    p.key = key->data();
    p.k_s0 = key->stride(0);
    p.k_s1 = key->stride(1);
    p.k_heads = static_cast<int>(key->size(1));
  }
  p.cache = cos_sin_cache.data();
  p.max_position = cos_sin_cache.size(0);
  p.half = static_cast<int>(cos_sin_cache.size(1) / 2);
  p.is_neox = is_neox;
  DeviceGuard guard(query.device());
  const cudaStream_t s = op_stream(stream, query.device());
  const int pairs = (p.q_heads + p.k_heads) * p.half;
  const int threads = std::min(512, std::max(32, (pairs + 31) / 32 * 32));
  const dim3 grid(static_cast<unsigned>(query.size(0)));
  const bool f32_cache = cos_sin_cache.dtype() == DType::kFloat32;
  dispatch_float(query.dtype(), "rotary_embedding", [&](auto t) {
    using T = decltype(t);
    if (f32_cache) {
      rotary_kernel<T, float><<<grid, threads, 0, s>>>(p);
    } else {
      rotary_kernel<T, T><<<grid, threads, 0, s>>>(p);
    }
  });
  check_launch("rotary_embedding");
}

}  // namespace pagedkv::cuda_ops
