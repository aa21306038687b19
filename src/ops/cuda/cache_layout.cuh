// Addressing of one KV cache (keys or values) in either layout, as element strides, so the same
// kernels read and write the vLLM layout and the NHD layout.
//
//   element (block, slot, head, d) is at
//     block * s_block + head * s_head + slot * s_slot + (d / x) * s_chunk + d % x
//   NHD  [num_blocks, block_size, num_kv_heads, head_size]:      x = head_size (one run)
//   vLLM key   [num_blocks, num_kv_heads, head_size/x, block_size, x]: x = 16 / element size
//   vLLM value [num_blocks, num_kv_heads, head_size, block_size]:     x = 1 (d strides by s_chunk)
#pragma once

#include <cstdint>

#include "ops/cuda/common.cuh"

namespace pagedkv::cuda_ops {

struct CacheLayout {
  int64_t s_block = 0, s_head = 0, s_slot = 0, s_chunk = 0;
  int x = 1;        // elements contiguous along the head dimension
  int x_shift = 0;  // log2(x) when x is a power of two (always so for the vLLM layout)

  // True when each (block, slot, head) row of head_size elements is contiguous (NHD, and any
  // layout that keeps rows whole): what row copies and tensor maps can address.
  __host__ __device__ bool whole_rows(int head_size) const {
    return s_chunk == 0 && x >= head_size;
  }

  // Offset of element d within a (block, slot, head) row, without a division on the hot path:
  // NHD rows are one run (d < x), vLLM runs have a power-of-two length.
  __device__ __forceinline__ int64_t d_offset(int d) const {
    if (d < x) return d;
    if (x_shift >= 0) return int64_t(d >> x_shift) * s_chunk + (d & (x - 1));
    return int64_t(d / x) * s_chunk + d % x;
  }
  __device__ __forceinline__ int64_t offset(int64_t block, int slot, int head, int d) const {
    return block * s_block + head * s_head + slot * s_slot + d_offset(d);
  }
};

inline int pow2_shift(int x) {
  int s = 0;
  while ((1 << s) < x) ++s;
  return (1 << s) == x ? s : -1;
}

// NHD: rank 4; vLLM: rank 5 (keys) or rank 4 with `is_vllm_value` (values).
inline CacheLayout make_layout(const TensorView& t, bool vllm, bool is_value) {
  CacheLayout l;
  if (!vllm) {  // [nb, bs, h, d]
    l.s_block = t.stride(0);
    l.s_slot = t.stride(1);
    l.s_head = t.stride(2);
    l.s_chunk = 0;
    l.x = static_cast<int>(t.size(3));
    l.x_shift = pow2_shift(l.x);
  } else if (!is_value) {  // [nb, h, d/x, bs, x]
    l.s_block = t.stride(0);
    l.s_head = t.stride(1);
    l.s_chunk = t.stride(2);
    l.s_slot = t.stride(3);
    l.x = static_cast<int>(t.size(4));
    l.x_shift = pow2_shift(l.x);
  } else {  // [nb, h, d, bs]
    l.s_block = t.stride(0);
    l.s_head = t.stride(1);
    l.s_chunk = t.stride(2);
    l.s_slot = t.stride(3);
    l.x = 1;
    l.x_shift = 0;
  }
  return l;
}

// True when every stride but the innermost and the base pointer are multiples of `bytes`, so
// runs of `bytes` along the innermost dimension can be moved as one vector.
inline bool vector_ok(const TensorView& t, int bytes) {
  if (reinterpret_cast<uintptr_t>(t.data()) % bytes) return false;
  for (int i = 0; i + 1 < t.ndim(); ++i) {
    if ((t.stride(i) * static_cast<int64_t>(t.element_size())) % bytes) return false;
  }
  return t.ndim() == 0 || t.stride(-1) == 1;
}

}  // namespace pagedkv::cuda_ops
