// Pieces shared by the CPU attention kernels: strided integer metadata readers, the logit
// transform (soft-cap, ALiBi) and per-thread scratch buffers.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ops/cpu/paged_cache.h"
#include "pagedkv/ops.h"

namespace pagedkv::cpu_ops {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A 1-D int32 or int64 array with any stride.
struct IntArray {
  const char* data = nullptr;
  int64_t stride_bytes = 0;
  bool is64 = false;
  IntArray() = default;
  explicit IntArray(const TensorView& t)
      : data(static_cast<const char*>(t.data())),
        stride_bytes(t.ndim() > 0 ? t.stride(0) * static_cast<int64_t>(t.element_size()) : 0),
        is64(t.dtype() == DType::kInt64) {}
  int64_t operator[](int64_t i) const {
    const char* p = data + i * stride_bytes;
    return is64 ? *reinterpret_cast<const int64_t*>(p) : *reinterpret_cast<const int32_t*>(p);
  }
};

// block_tables [num_seqs, max_blocks_per_seq] int32, any strides.
struct BlockTable {
  const int32_t* data = nullptr;
  int64_t s0 = 0, s1 = 0;
  BlockTable() = default;
  explicit BlockTable(const TensorView& t)
      : data(t.data_as<const int32_t>()), s0(t.stride(0)), s1(t.stride(1)) {}
  int64_t operator()(int64_t seq, int64_t blk) const { return data[seq * s0 + blk * s1]; }
};

// A row (token, head) of a [tokens, heads, head_size] array with a contiguous last dim.
struct RowArray {
  char* data = nullptr;
  int64_t s0 = 0, s1 = 0;  // bytes
  DType dtype = DType::kFloat32;
  RowArray() = default;
  explicit RowArray(const TensorView& t)
      : data(static_cast<char*>(t.data())),
        s0(t.stride(0) * static_cast<int64_t>(t.element_size())),
        s1(t.stride(1) * static_cast<int64_t>(t.element_size())),
        dtype(t.dtype()) {}
  char* row(int64_t i, int64_t h) const { return data + i * s0 + h * s1; }
};

// The logit of query position qpos against key position kpos, before masking:
// scale * q.k (the scale is folded into q), soft-capped, plus the ALiBi bias.
struct LogitTransform {
  float soft_cap = 0.0f;
  const float* alibi = nullptr;  // [num_heads] or null
  int64_t alibi_stride = 1;

  float slope(int head) const { return alibi ? alibi[head * alibi_stride] : 0.0f; }
  // Applies cap and bias to logits of keys kpos0 .. kpos0 + n - 1 for one query position.
  void apply(float* s, int n, float slope_h, int64_t kpos0, int64_t qpos) const {
    if (soft_cap > 0.0f) {
      const float inv = 1.0f / soft_cap;
      for (int j = 0; j < n; ++j) s[j] = soft_cap * std::tanh(s[j] * inv);
    }
    if (alibi) {
      for (int j = 0; j < n; ++j) s[j] += slope_h * static_cast<float>(kpos0 + j - qpos);
    }
  }
};

inline LogitTransform make_transform(const AttentionOptions& o) {
  LogitTransform t;
  t.soft_cap = o.logits_soft_cap;
  if (o.alibi_slopes) {
    t.alibi = o.alibi_slopes->data_as<const float>();
    t.alibi_stride = o.alibi_slopes->stride(0);
  }
  return t;
}

// Grows (never shrinks) a per-thread buffer and returns its storage.
inline float* scratch(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace pagedkv::cpu_ops
