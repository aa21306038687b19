// reshape_and_cache (vLLM layout) and reshape_and_cache_flash (NHD layout): scatter the new
// tokens' keys and values into their cache slots, optionally quantising to fp8 (stored = x/scale).
//
// One thread moves one run of 8 elements of one (token, head) for both keys and values: 16-byte
// loads and stores where the layout and alignment allow (NHD and vLLM keys), element stores for
// the vLLM value layout (its head dimension strides by block_size).
#include "ops/cuda/bulk_copy.cuh"
#include "ops/cuda/cache_layout.cuh"
#include "ops/cuda/cuda_ops.h"

namespace pagedkv::cuda_ops {
namespace {

constexpr int kRun = 8;  // elements per thread; every supported head size is a multiple of 8

struct CacheWriteParams {
  const void* key;    // [num_tokens, num_kv_heads, head_size]
  const void* value;  // [num_tokens, num_kv_heads, head_size]
  int64_t k_s_tok, k_s_head, v_s_tok, v_s_head;
  void* key_cache;
  void* value_cache;
  CacheLayout kl, vl;
  const int64_t* slot_mapping;  // [num_tokens] int64, negative = padding
  int64_t num_tokens, num_slots;
  int num_heads, head_size, block_size;
  DeviceScale k_scale, v_scale;  // fp8: stored = x / scale
  int fp8;                       // Fp8Kind of the cache
  bool src_vec;                  // key/value rows can be read 16 bytes at a time
  bool dst_vec;                  // cache runs can be written as vectors
};

template <typename T>
__device__ __forceinline__ void load_run(const T* src, bool vec, float* f) {
  if constexpr (sizeof(T) == 2) {
    if (vec) {
      unpack8(ldg16(src), src, f);
      return;
    }
  } else {
    if (vec) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(src));
      const float4 b = __ldg(reinterpret_cast<const float4*>(src) + 1);
      f[0] = a.x;
      f[1] = a.y;
      f[2] = a.z;
      f[3] = a.w;
      f[4] = b.x;
      f[5] = b.y;
      f[6] = b.z;
      f[7] = b.w;
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < kRun; ++i) f[i] = to_float(src[i]);
}

// Writes 8 values at head offset d0 of (block, slot, head).
template <typename T, typename CT>
__device__ __forceinline__ void store_run(CT* cache, const CacheLayout& l, int64_t block, int slot,
                                          int head, int d0, const float* f, float scale, int fp8,
                                          bool vec) {
  if constexpr (sizeof(CT) == 1) {
    uint8_t q[kRun];
#pragma unroll
    for (int i = 0; i < kRun; ++i) q[i] = float_to_fp8(f[i] / scale, fp8);
    if (vec && l.x >= kRun) {
      uint2 r;
      uint8_t* b = reinterpret_cast<uint8_t*>(&r);
#pragma unroll
      for (int i = 0; i < kRun; ++i) b[i] = q[i];
      *reinterpret_cast<uint2*>(cache + l.offset(block, slot, head, d0)) = r;
    } else {
#pragma unroll
      for (int i = 0; i < kRun; ++i) cache[l.offset(block, slot, head, d0 + i)] = q[i];
    }
  } else {
    if (vec && l.x >= kRun) {
      store8(cache + l.offset(block, slot, head, d0), f);
    } else if (vec && l.x == 4) {  // float32 vLLM keys: two runs of 4
      CT* a = cache + l.offset(block, slot, head, d0);
      CT* b = cache + l.offset(block, slot, head, d0 + 4);
      *reinterpret_cast<float4*>(a) = make_float4(f[0], f[1], f[2], f[3]);
      *reinterpret_cast<float4*>(b) = make_float4(f[4], f[5], f[6], f[7]);
    } else {
#pragma unroll
      for (int i = 0; i < kRun; ++i)
        cache[l.offset(block, slot, head, d0 + i)] = from_float<CT>(f[i]);
    }
  }
}

template <typename T, typename CT>
__global__ void cache_write_kernel(CacheWriteParams p) {
  pdl_trigger();  // a decode launched as its programmatic dependent may start (it waits for this)
  const int runs = p.head_size / kRun;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.num_tokens * p.num_heads * runs) return;
  const int r = static_cast<int>(idx % runs);
  const int h = static_cast<int>((idx / runs) % p.num_heads);
  const int64_t t = idx / (static_cast<int64_t>(runs) * p.num_heads);
  const int64_t slot = p.slot_mapping[t];
  if (slot < 0 || slot >= p.num_slots) return;  // padding (or a bad slot: never a wild write)
  const int64_t block = slot / p.block_size;
  const int off = static_cast<int>(slot % p.block_size);
  const int d0 = r * kRun;
  float f[kRun];
  const T* k = static_cast<const T*>(p.key) + t * p.k_s_tok + h * p.k_s_head + d0;
  load_run(k, p.src_vec, f);
  store_run<T>(static_cast<CT*>(p.key_cache), p.kl, block, off, h, d0, f, p.k_scale.get(), p.fp8,
               p.dst_vec);
  const T* v = static_cast<const T*>(p.value) + t * p.v_s_tok + h * p.v_s_head + d0;
  load_run(v, p.src_vec, f);
  store_run<T>(static_cast<CT*>(p.value_cache), p.vl, block, off, h, d0, f, p.v_scale.get(), p.fp8,
               p.dst_vec);
}

template <typename T>
void launch_typed(const CacheWriteParams& p, cudaStream_t stream) {
  const int64_t n = p.num_tokens * p.num_heads * (p.head_size / kRun);
  const int threads = 256;
  const int64_t blocks = (n + threads - 1) / threads;
  if (p.fp8 != kNoFp8) {
    cache_write_kernel<T, uint8_t><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(p);
  } else {
    cache_write_kernel<T, T><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(p);
  }
}

void cache_write(const TensorView& key, const TensorView& value, const TensorView& key_cache,
                 const TensorView& value_cache, const TensorView& slot_mapping,
                 KVCacheDType kv_cache_dtype, const Scale& k_scale, const Scale& v_scale,
                 Stream stream, bool vllm) {
  if (slot_mapping.size(0) == 0) return;
  DeviceGuard guard(key.device());
  CacheWriteParams p{};
  p.key = key.data();
  p.value = value.data();
  p.k_s_tok = key.stride(0);
  p.k_s_head = key.stride(1);
  p.v_s_tok = value.stride(0);
  p.v_s_head = value.stride(1);
  p.key_cache = key_cache.data();
  p.value_cache = value_cache.data();
  p.kl = make_layout(key_cache, vllm, false);
  p.vl = make_layout(value_cache, vllm, true);
  p.slot_mapping = slot_mapping.data_as<const int64_t>();
  p.num_tokens = slot_mapping.size(0);  // may be shorter than key (vLLM: padded batches)
  p.num_heads = static_cast<int>(key.size(1));
  p.head_size = static_cast<int>(key.size(2));
  p.block_size = static_cast<int>(vllm ? key_cache.size(3) : key_cache.size(1));
  p.num_slots = key_cache.size(0) * p.block_size;
  p.fp8 = fp8_kind(kv_cache_dtype);
  p.k_scale = device_scale(k_scale, p.fp8 != kNoFp8);
  p.v_scale = device_scale(v_scale, p.fp8 != kNoFp8);
  p.src_vec = vector_ok(key, 16) && vector_ok(value, 16);
  const int run_bytes = kRun * static_cast<int>(key_cache.element_size());
  const int dst_align = run_bytes > 16 ? 16 : run_bytes;
  p.dst_vec = vector_ok(key_cache, dst_align) && vector_ok(value_cache, dst_align);
  const cudaStream_t s = op_stream(stream, key.device());
  switch (key.dtype()) {
    case DType::kFloat32: launch_typed<float>(p, s); break;
    case DType::kFloat16: launch_typed<__half>(p, s); break;
    case DType::kBFloat16: launch_typed<__nv_bfloat16>(p, s); break;
    default: throw TypeError("key: unsupported dtype for the CUDA cache write");
  }
  check_launch(vllm ? "reshape_and_cache" : "reshape_and_cache_flash");
}

}  // namespace

void reshape_and_cache(const TensorView& key, const TensorView& value, const TensorView& key_cache,
                       const TensorView& value_cache, const TensorView& slot_mapping,
                       KVCacheDType kv_cache_dtype, const Scale& k_scale, const Scale& v_scale,
                       Stream stream) {
  cache_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
              stream, /*vllm=*/true);
}

void reshape_and_cache_flash(const TensorView& key, const TensorView& value,
                             const TensorView& key_cache, const TensorView& value_cache,
                             const TensorView& slot_mapping, KVCacheDType kv_cache_dtype,
                             const Scale& k_scale, const Scale& v_scale, Stream stream) {
  cache_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
              stream, /*vllm=*/false);
}

}  // namespace pagedkv::cuda_ops
