// Inner loops of the CPU kernels: row conversions to/from fp32 and fp32 dot / axpy, written
// with GCC/Clang vector extensions (8 floats) so they compile to SSE in the portable build and
// to AVX2+FMA inside functions marked PAGEDKV_MULTIVERSION (runtime-dispatched clones).
// Everything here is always_inline so that it is compiled with the caller's target.
#pragma once

#include <cstdint>
#include <cstring>

#include "ops/cpu/half.h"
#include "pagedkv/tensor.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define PAGEDKV_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define PAGEDKV_MULTIVERSION
#endif
#define PAGEDKV_INLINE inline __attribute__((always_inline))

// The 32-byte vector type below never crosses a non-inlined call, so the ABI note is moot.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace pagedkv::cpu_ops {

typedef float f32x8 __attribute__((vector_size(32)));

PAGEDKV_INLINE f32x8 load8(const float* p) {
  f32x8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
PAGEDKV_INLINE void store8(float* p, f32x8 v) { std::memcpy(p, &v, sizeof v); }
PAGEDKV_INLINE float hsum(f32x8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// sum_i a[i] * b[i] in fp32 (two vector accumulators for latency hiding).
PAGEDKV_INLINE float dot(const float* a, const float* b, int n) {
  f32x8 s0 = {}, s1 = {};
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 += load8(a + i) * load8(b + i);
    s1 += load8(a + i + 8) * load8(b + i + 8);
  }
  for (; i + 8 <= n; i += 8) s0 += load8(a + i) * load8(b + i);
  float r = hsum(s0 + s1);
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

// y[i] += a * x[i]
PAGEDKV_INLINE void axpy(float a, const float* x, float* y, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8) store8(y + i, load8(y + i) + a * load8(x + i));
  for (; i < n; ++i) y[i] += a * x[i];
}

// y[i] *= a
PAGEDKV_INLINE void scale_row(float a, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] *= a;
}

// n elements of dtype (float32 / float16 / bfloat16) -> fp32.
PAGEDKV_INLINE void load_row(const void* src, DType dtype, float* dst, int n) {
  if (dtype == DType::kFloat32) {
    std::memcpy(dst, src, sizeof(float) * n);
  } else if (dtype == DType::kFloat16) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (int i = 0; i < n; ++i) dst[i] = half_to_float(s[i]);
  } else {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (int i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);
  }
}

// n fp8 codes -> fp32 through the format's 256-entry table, times the cache scale.
PAGEDKV_INLINE void load_row_fp8(const uint8_t* src, const float* table, float scale, float* dst,
                                 int n) {
  for (int i = 0; i < n; ++i) dst[i] = table[src[i]] * scale;
}

// n fp32 -> dtype (rounded to nearest even).
PAGEDKV_INLINE void store_row(const float* src, DType dtype, void* dst, int n) {
  if (dtype == DType::kFloat32) {
    std::memcpy(dst, src, sizeof(float) * n);
  } else if (dtype == DType::kFloat16) {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int i = 0; i < n; ++i) d[i] = float_to_half(src[i]);
  } else {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int i = 0; i < n; ++i) d[i] = float_to_bf16(src[i]);
  }
}

}  // namespace pagedkv::cpu_ops
