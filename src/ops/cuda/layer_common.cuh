// Pieces shared by the CUDA layer ops (rms_norm.cu, rotary_embedding.cu, activation.cu): packed
// loads and stores of V elements, rounding to the array's dtype, a block-wide sum and the
// dtype dispatch. Loads are plain (not __ldg): the ops work in place, reading what they write.
#pragma once

#include <algorithm>
#include <string>

#include "ops/cuda/common.cuh"

namespace pagedkv::cuda_ops {

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// V consecutive elements at p (aligned to V elements) to floats, and back.
template <typename T, int V>
__device__ __forceinline__ void load_pack(const T* p, float* f) {
  const Pack<T, V> r = *reinterpret_cast<const Pack<T, V>*>(p);
#pragma unroll
  for (int i = 0; i < V; ++i) f[i] = to_float(r.v[i]);
}

template <typename T, int V>
__device__ __forceinline__ void store_pack(T* p, const float* f) {
  Pack<T, V> r;
#pragma unroll
  for (int i = 0; i < V; ++i) r.v[i] = from_float<T>(f[i]);
  *reinterpret_cast<Pack<T, V>*>(p) = r;
}

// x rounded to T and back: the layer ops round where the eager reference does.
template <typename T>
__device__ __forceinline__ float round_to(float x) {
  return to_float(from_float<T>(x));
}

// The sum of v over the block (blockDim.x a multiple of 32, at most 1024), in every thread.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? partial[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Elements per 16-byte pack of a dtype.
inline int pack_width(DType dtype) { return dtype == DType::kFloat32 ? 4 : 8; }

// Each array's data and the byte steps between its rows keep 16-byte packs aligned.
inline bool rows_aligned(const TensorView& t) {
  const int64_t es = static_cast<int64_t>(t.element_size());
  if (!aligned16(t.data())) return false;
  for (int d = 0; d + 1 < t.ndim(); ++d)
    if (t.size(d) > 1 && (t.stride(d) * es) % 16 != 0) return false;
  return true;
}

// Calls f(T{}) with the C++ element type of a float32 / float16 / bfloat16 array.
template <typename F>
void dispatch_float(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::kFloat32: f(float{}); break;
    case DType::kFloat16: f(__half{}); break;
    case DType::kBFloat16: f(__nv_bfloat16{}); break;
    default: throw TypeError(std::string(what) + ": unsupported dtype");
  }
}

}  // namespace pagedkv::cuda_ops
