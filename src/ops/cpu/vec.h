// Inner loops of the CPU kernels: row conversions to/from fp32 and fp32 dot / axpy, written
// with GCC/Clang vector extensions (8 floats) so they compile to SSE in the portable build and
// to AVX2+FMA inside functions marked PAGEDKV_MULTIVERSION (runtime-dispatched clones).
// Everything here is always_inline so that it is compiled with the caller's target.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "ops/cpu/half.h"
#include "ops/cpu/half_f16c.h"
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

typedef uint32_t u32x8 __attribute__((vector_size(32)));
typedef uint16_t u16x8 __attribute__((vector_size(16)));

// 8 fp16 -> 8 fp32: half_to_float (half.h) with vector selects instead of branches.
PAGEDKV_INLINE void half8_to_float(const uint16_t* src, float* dst) {
  u16x8 h16;
  std::memcpy(&h16, src, sizeof h16);
  const u32x8 h = __builtin_convertvector(h16, u32x8);
  const u32x8 zero = {};
  const u32x8 sign = (h & 0x8000u) << 16;
  const u32x8 em = (h & 0x7fffu) << 13;
  const u32x8 exp = em & 0x0f800000u;
  const u32x8 mag = exp == 0x0f800000u ? em + (224u << 23) : em + (112u << 23);
  const u32x8 sub_in = em + (113u << 23);
  f32x8 sub;
  std::memcpy(&sub, &sub_in, sizeof sub);
  sub -= 6.103515625e-05f;  // bits 113 << 23 = 2^-14
  u32x8 sub_bits;
  std::memcpy(&sub_bits, &sub, sizeof sub_bits);
  const u32x8 out = (exp == zero ? sub_bits : mag) | sign;
  std::memcpy(dst, &out, sizeof out);
}

// 8 bf16 -> 8 fp32 (a shift).
PAGEDKV_INLINE void bf16x8_to_float(const uint16_t* src, float* dst) {
  u16x8 h16;
  std::memcpy(&h16, src, sizeof h16);
  const u32x8 out = __builtin_convertvector(h16, u32x8) << 16;
  std::memcpy(dst, &out, sizeof out);
}

// n elements of dtype (float32 / float16 / bfloat16) -> fp32.
PAGEDKV_INLINE void load_row(const void* src, DType dtype, float* dst, int n) {
  if (dtype == DType::kFloat32) {
    std::memcpy(dst, src, sizeof(float) * n);
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(src);
  int i = 0;
  if (dtype == DType::kFloat16) {
#if PAGEDKV_HAVE_F16C_PATH
    if (kHasF16C && n >= 16) {
      half_row_to_float_f16c(s, dst, n);
      return;
    }
#endif
    for (; i + 8 <= n; i += 8) half8_to_float(s + i, dst + i);
    for (; i < n; ++i) dst[i] = half_to_float(s[i]);
  } else {
    for (; i + 8 <= n; i += 8) bf16x8_to_float(s + i, dst + i);
    for (; i < n; ++i) dst[i] = bf16_to_float(s[i]);
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

namespace pagedkv::cpu_ops {

typedef int32_t i32x8 __attribute__((vector_size(32)));

// exp(x) for 8 lanes: range reduction x = k ln2 + r, |r| <= ln2/2, then a degree-6 polynomial
// (Cephes expf coefficients, ~1 ulp). Inputs below -87.3 (including -inf) give exactly 0.
PAGEDKV_INLINE f32x8 exp8(f32x8 x) {
  const f32x8 zero = {};
  const auto underflow = x < -87.3f;
  x = x > 88.7f ? zero + 88.7f : x;
  x = underflow ? zero : x;
  const f32x8 magic = zero + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const f32x8 k = (x * 1.44269504088896341f + magic) - magic;
  f32x8 r = x - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  f32x8 p = zero + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const i32x8 ki = __builtin_convertvector(k, i32x8);
  i32x8 bits;
  std::memcpy(&bits, &p, sizeof bits);
  bits += ki << 23;
  f32x8 y;
  std::memcpy(&y, &bits, sizeof y);
  return underflow ? zero : y;
}

// s[i] = exp(s[i] - m); returns the sum. m must be finite.
PAGEDKV_INLINE float exp_sub_sum(float* s, int n, float m) {
  f32x8 acc = {};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const f32x8 e = exp8(load8(s + i) - m);
    store8(s + i, e);
    acc += e;
  }
  float sum = hsum(acc);
  if (i < n) {
    float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const int rest = n - i;
    for (int j = 0; j < 8; ++j) tail[j] = j < rest ? s[i + j] - m : -INFINITY;
    const f32x8 e = exp8(load8(tail));
    for (int j = 0; j < rest; ++j) {
      s[i + j] = e[j];
      sum += e[j];
    }
  }
  return sum;
}

PAGEDKV_INLINE float max_of(const float* s, int n, float init) {
  float m = init;
  for (int i = 0; i < n; ++i) m = s[i] > m ? s[i] : m;
  return m;
}

// S[r * lds + j] (+)= dot(A[r * lda ..], B[j * ldb ..]) over k elements, for r < R, j < N.
// Register-blocked 4 x 2 (eight 8-lane accumulators); covers Q K^T with row-major keys, and
// P V^T when values are stored transposed.
template <bool kAccumulate>
PAGEDKV_INLINE void dot_tile(const float* A, int64_t lda, int R, const float* B, int64_t ldb, int N,
                             int k, float* S, int64_t lds) {
  const int k8 = k & ~7;
  auto put = [&](int r, int j, float v) {
    float* o = S + r * lds + j;
    *o = kAccumulate ? *o + v : v;
  };
  auto tail = [&](int r, int j) {
    float v = 0.0f;
    for (int d = k8; d < k; ++d) v += A[r * lda + d] * B[j * ldb + d];
    return v;
  };
  int r = 0;
  for (; r + 4 <= R; r += 4) {
    const float* a0 = A + r * lda;
    int j = 0;
    for (; j + 2 <= N; j += 2) {
      const float* b0 = B + j * ldb;
      const float* b1 = b0 + ldb;
      f32x8 c00 = {}, c01 = {}, c10 = {}, c11 = {}, c20 = {}, c21 = {}, c30 = {}, c31 = {};
      for (int d = 0; d < k8; d += 8) {
        const f32x8 x0 = load8(b0 + d), x1 = load8(b1 + d);
        f32x8 q = load8(a0 + d);
        c00 += q * x0;
        c01 += q * x1;
        q = load8(a0 + lda + d);
        c10 += q * x0;
        c11 += q * x1;
        q = load8(a0 + 2 * lda + d);
        c20 += q * x0;
        c21 += q * x1;
        q = load8(a0 + 3 * lda + d);
        c30 += q * x0;
        c31 += q * x1;
      }
      put(r, j, hsum(c00) + tail(r, j));
      put(r, j + 1, hsum(c01) + tail(r, j + 1));
      put(r + 1, j, hsum(c10) + tail(r + 1, j));
      put(r + 1, j + 1, hsum(c11) + tail(r + 1, j + 1));
      put(r + 2, j, hsum(c20) + tail(r + 2, j));
      put(r + 2, j + 1, hsum(c21) + tail(r + 2, j + 1));
      put(r + 3, j, hsum(c30) + tail(r + 3, j));
      put(r + 3, j + 1, hsum(c31) + tail(r + 3, j + 1));
    }
    for (; j < N; ++j)
      for (int i = 0; i < 4; ++i) put(r + i, j, dot(A + (r + i) * lda, B + j * ldb, k));
  }
  for (; r < R; ++r) {
    int j = 0;
    for (; j + 4 <= N; j += 4) {
      const float* a = A + r * lda;
      const float* b0 = B + j * ldb;
      f32x8 c0 = {}, c1 = {}, c2 = {}, c3 = {};
      for (int d = 0; d < k8; d += 8) {
        const f32x8 q = load8(a + d);
        c0 += q * load8(b0 + d);
        c1 += q * load8(b0 + ldb + d);
        c2 += q * load8(b0 + 2 * ldb + d);
        c3 += q * load8(b0 + 3 * ldb + d);
      }
      put(r, j, hsum(c0) + tail(r, j));
      put(r, j + 1, hsum(c1) + tail(r, j + 1));
      put(r, j + 2, hsum(c2) + tail(r, j + 2));
      put(r, j + 3, hsum(c3) + tail(r, j + 3));
    }
    for (; j < N; ++j) put(r, j, dot(A + r * lda, B + j * ldb, k));
  }
}

// O[r * ldo + d] += sum_j P[r * ldp + j] * V[j * ldv + d] for r < R, j < N, d < D (V row-major).
// Register-blocked 4 rows x 16 columns; accumulators stay in registers across all N keys.
PAGEDKV_INLINE void pv_tile(const float* P, int64_t ldp, int R, const float* V, int64_t ldv, int N,
                            int D, float* O, int64_t ldo) {
  const int d16 = D & ~15, d8 = D & ~7;
  int r = 0;
  for (; r + 4 <= R; r += 4) {
    const float* p0 = P + r * ldp;
    float* o0 = O + r * ldo;
    for (int d = 0; d < d16; d += 16) {
      f32x8 c00 = {}, c01 = {}, c10 = {}, c11 = {}, c20 = {}, c21 = {}, c30 = {}, c31 = {};
      for (int j = 0; j < N; ++j) {
        const f32x8 v0 = load8(V + j * ldv + d), v1 = load8(V + j * ldv + d + 8);
        float w = p0[j];
        c00 += w * v0;
        c01 += w * v1;
        w = p0[ldp + j];
        c10 += w * v0;
        c11 += w * v1;
        w = p0[2 * ldp + j];
        c20 += w * v0;
        c21 += w * v1;
        w = p0[3 * ldp + j];
        c30 += w * v0;
        c31 += w * v1;
      }
      store8(o0 + d, load8(o0 + d) + c00);
      store8(o0 + d + 8, load8(o0 + d + 8) + c01);
      store8(o0 + ldo + d, load8(o0 + ldo + d) + c10);
      store8(o0 + ldo + d + 8, load8(o0 + ldo + d + 8) + c11);
      store8(o0 + 2 * ldo + d, load8(o0 + 2 * ldo + d) + c20);
      store8(o0 + 2 * ldo + d + 8, load8(o0 + 2 * ldo + d + 8) + c21);
      store8(o0 + 3 * ldo + d, load8(o0 + 3 * ldo + d) + c30);
      store8(o0 + 3 * ldo + d + 8, load8(o0 + 3 * ldo + d + 8) + c31);
    }
    for (int d = d16; d < d8; d += 8) {
      f32x8 c0 = {}, c1 = {}, c2 = {}, c3 = {};
      for (int j = 0; j < N; ++j) {
        const f32x8 v0 = load8(V + j * ldv + d);
        c0 += p0[j] * v0;
        c1 += p0[ldp + j] * v0;
        c2 += p0[2 * ldp + j] * v0;
        c3 += p0[3 * ldp + j] * v0;
      }
      store8(o0 + d, load8(o0 + d) + c0);
      store8(o0 + ldo + d, load8(o0 + ldo + d) + c1);
      store8(o0 + 2 * ldo + d, load8(o0 + 2 * ldo + d) + c2);
      store8(o0 + 3 * ldo + d, load8(o0 + 3 * ldo + d) + c3);
    }
    for (int d = d8; d < D; ++d)
      for (int i = 0; i < 4; ++i) {
        float v = 0.0f;
        for (int j = 0; j < N; ++j) v += p0[i * ldp + j] * V[j * ldv + d];
        o0[i * ldo + d] += v;
      }
  }
  for (; r < R; ++r) {
    const float* p = P + r * ldp;
    float* o = O + r * ldo;
    for (int d = 0; d < d16; d += 16) {
      f32x8 c0 = {}, c1 = {};
      for (int j = 0; j < N; ++j) {
        c0 += p[j] * load8(V + j * ldv + d);
        c1 += p[j] * load8(V + j * ldv + d + 8);
      }
      store8(o + d, load8(o + d) + c0);
      store8(o + d + 8, load8(o + d + 8) + c1);
    }
    for (int d = d16; d < D; ++d) {
      float v = 0.0f;
      for (int j = 0; j < N; ++j) v += p[j] * V[j * ldv + d];
      o[d] += v;
    }
  }
}

}  // namespace pagedkv::cpu_ops
