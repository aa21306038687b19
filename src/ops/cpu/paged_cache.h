// Read access to one paged KV cache (keys or values) in either layout and any supported
// storage type, producing fp32 tiles [n_tokens, head_size] that the attention kernels consume.
//
//   vLLM key   [num_blocks, H, D / x, block_size, x]  element (t, d): (d / x) * bs * x + t * x + d
//   % x vLLM value [num_blocks, H, D, block_size]         element (t, d): d * bs + t NHD
//   [num_blocks, block_size, H, D]          element (t, d): t * H * D + h * D + d
#pragma once

#include <cstdint>

#include "ops/cpu/fp8.h"
#include "ops/cpu/vec.h"
#include "pagedkv/ops.h"

namespace pagedkv::cpu_ops {

struct PagedCache {
  const char* base = nullptr;
  int64_t block_stride = 0;  // bytes between consecutive blocks
  KVLayout layout = KVLayout::kNHD;
  bool is_key = true;
  DType dtype = DType::kFloat32;  // storage dtype (uint8 for fp8)
  const float* fp8 = nullptr;     // decode table when the cache holds fp8, else null
  float scale = 1.0f;             // fp8 read scale
  int block_size = 0, num_heads = 0, head_size = 0, x = 0;
  int64_t elem = 0;  // element size in bytes

  // `cache` is a key cache (rank 5 or 4) or a value cache (rank 4) already validated.
  static PagedCache make(const TensorView& cache, bool is_key, bool vllm_layout,
                         KVCacheDType kv_dtype, float scale) {
    PagedCache c;
    c.base = static_cast<const char*>(cache.data());
    c.elem = static_cast<int64_t>(cache.element_size());
    c.block_stride = cache.stride(0) * c.elem;
    c.layout = vllm_layout ? KVLayout::kVLLM : KVLayout::kNHD;
    c.is_key = is_key;
    c.dtype = cache.dtype();
    if (kv_dtype != KVCacheDType::kAuto) c.fp8 = fp8_table(fp8_format(kv_dtype));
    c.scale = scale;
    c.x = static_cast<int>(16 / c.elem);
    if (vllm_layout) {
      c.num_heads = static_cast<int>(cache.size(1));
      c.head_size = static_cast<int>(is_key ? cache.size(2) * cache.size(4) : cache.size(2));
      c.block_size = static_cast<int>(cache.size(3));
    } else {
      c.block_size = static_cast<int>(cache.size(1));
      c.num_heads = static_cast<int>(cache.size(2));
      c.head_size = static_cast<int>(cache.size(3));
    }
    return c;
  }

  // `n` contiguous source elements -> fp32.
  PAGEDKV_INLINE void convert(const char* src, float* dst, int n) const {
    if (fp8) {
      load_row_fp8(reinterpret_cast<const uint8_t*>(src), fp8, scale, dst, n);
    } else {
      load_row(src, dtype, dst, n);
    }
  }

  // fp32 NHD caches are read in place: the rows of tokens t0.. of `block`, head h, with the
  // row stride (elements) in *ld. Null for every other layout / dtype (use load()).
  PAGEDKV_INLINE const float* rows(int64_t block, int h, int t0, int64_t* ld) const {
    if (layout != KVLayout::kNHD || fp8 || dtype != DType::kFloat32) return nullptr;
    *ld = static_cast<int64_t>(num_heads) * head_size;
    return reinterpret_cast<const float*>(base + block * block_stride) + t0 * *ld +
           static_cast<int64_t>(h) * head_size;
  }

  // Asks the memory system for tokens [t0, t0 + n) of `block`, head h, ahead of use. NHD rows of
  // one head are num_heads * head_size elements apart (often > 4 KiB, beyond the hardware
  // prefetcher); a vLLM-layout head is one contiguous run.
  PAGEDKV_INLINE void prefetch(int64_t block, int h, int t0, int n) const {
    const char* blk = base + block * block_stride;
    const int64_t row = static_cast<int64_t>(head_size) * elem;
    if (layout == KVLayout::kNHD) {
      for (int t = 0; t < n; ++t) {
        const char* r = blk + ((static_cast<int64_t>(t0 + t) * num_heads + h) * head_size) * elem;
        for (int64_t b = 0; b < row; b += 64) __builtin_prefetch(r + b);
      }
    } else {
      const char* r = blk + static_cast<int64_t>(h) * head_size * block_size * elem;
      for (int64_t b = 0; b < row * block_size; b += 64) __builtin_prefetch(r + b);
    }
  }

  // Tokens [t0, t0 + n) of physical block `block`, head h -> dst [n, head_size] fp32.
  // (For the transposed vLLM value layout prefer load_transposed.)
  PAGEDKV_INLINE void load(int64_t block, int h, int t0, int n, float* dst) const {
    const int D = head_size, bs = block_size;
    const char* blk = base + block * block_stride;
    if (layout == KVLayout::kNHD) {
      for (int t = 0; t < n; ++t)
        convert(blk + ((static_cast<int64_t>(t0 + t) * num_heads + h) * D) * elem, dst + t * D, D);
    } else if (is_key) {
      const char* head = blk + static_cast<int64_t>(h) * D * bs * elem;
      // Chunks of x elements = 16 bytes: fixed-size copies / conversions (no memcpy calls).
      for (int c = 0; c < D / x; ++c) {
        const char* src = head + (static_cast<int64_t>(c) * bs * x + t0 * x) * elem;
        float* out = dst + c * x;
        if (fp8) {
          for (int t = 0; t < n; ++t)
            load_row_fp8(reinterpret_cast<const uint8_t*>(src) + t * 16, fp8, scale, out + t * D,
                         16);
        } else if (dtype == DType::kFloat32) {
          for (int t = 0; t < n; ++t) std::memcpy(out + t * D, src + t * 16, 16);
        } else if (dtype == DType::kFloat16) {
          // The chunk's n tokens are contiguous: convert them in one run, then place them.
          float run[32 * 8];
          for (int t = 0; t < n; t += 32) {
            const int m = n - t < 32 ? n - t : 32;
            load_row(src + t * 16, DType::kFloat16, run, m * 8);
            for (int j = 0; j < m; ++j) std::memcpy(out + (t + j) * D, run + j * 8, 32);
          }
        } else {
          for (int t = 0; t < n; ++t)
            bf16x8_to_float(reinterpret_cast<const uint16_t*>(src + t * 16), out + t * D);
        }
      }
    } else {
      float run[256];
      const char* head = blk + static_cast<int64_t>(h) * D * bs * elem;
      for (int d = 0; d < D; ++d) {
        for (int t = 0; t < n; t += 256) {
          const int m = n - t < 256 ? n - t : 256;
          convert(head + (static_cast<int64_t>(d) * bs + t0 + t) * elem, run, m);
          for (int j = 0; j < m; ++j) dst[(t + j) * D + d] = run[j];
        }
      }
    }
  }

  // vLLM value layout only: the whole block of head h as dst [head_size, block_size] fp32, with
  // token columns outside [t0, t0 + n) set to 0 (they may hold stale or poisoned values).
  PAGEDKV_INLINE void load_transposed(int64_t block, int h, int t0, int n, float* dst) const {
    const int D = head_size, bs = block_size;
    const char* head = base + block * block_stride + static_cast<int64_t>(h) * D * bs * elem;
    for (int d = 0; d < D; ++d) {
      float* row = dst + static_cast<int64_t>(d) * bs;
      for (int t = 0; t < t0; ++t) row[t] = 0.0f;
      convert(head + (static_cast<int64_t>(d) * bs + t0) * elem, row + t0, n);
      for (int t = t0 + n; t < bs; ++t) row[t] = 0.0f;
    }
  }
};

}  // namespace pagedkv::cpu_ops
