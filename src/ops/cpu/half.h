// fp16 / bf16 <-> fp32 conversions written with integer bit operations, so the CPU kernels need
// no compiler half-precision support and no CUDA headers. The fp16 -> fp32 path is branch-free
// (selects only) so that loops over rows auto-vectorise.
#pragma once

#include <cstdint>
#include <cstring>

namespace pagedkv::cpu_ops {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// IEEE binary16 -> binary32, exact for every input (subnormals, inf, NaN included).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = static_cast<uint32_t>(h & 0x7fffu) << 13;  // exponent+mantissa, fp32 spot
  const uint32_t exp = em & 0x0f800000u;
  // Normal numbers: rebias the exponent by 127 - 15.
  const uint32_t normal = em + (112u << 23);
  // Inf / NaN: exponent all ones in both formats.
  const uint32_t infnan = em + (224u << 23);
  // Subnormals: let the FPU normalise (magic-number subtraction, exact).
  const float sub = bits_to_float(em + (113u << 23)) - bits_to_float(113u << 23);
  const uint32_t mag = exp == 0x0f800000u ? infnan : normal;
  const float f = exp == 0 ? sub : bits_to_float(mag);
  return bits_to_float(float_to_bits(f) | sign);
}

// binary32 -> binary16 with round-to-nearest-even; overflow gives inf, NaN stays NaN.
inline uint16_t float_to_half(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: overflow to inf
  if (a < 0x38800000u) {
    // Result is subnormal (or zero): scale so that one fp16 subnormal ulp (2^-24) is 1.0 and
    // let the FPU round to nearest even.
    const float scaled = bits_to_float(a) * 16777216.0f;     // 2^24, exact
    const float rounded = scaled + 8388608.0f - 8388608.0f;  // RNE to an integer (< 2^23)
    return sign | static_cast<uint16_t>(rounded);
  }
  // Normal: drop 13 mantissa bits with round-to-nearest-even; a carry bumps the exponent.
  const uint32_t rebased = a - (112u << 23);
  const uint32_t rounded = rebased + 0x0fffu + ((rebased >> 13) & 1u);
  return sign | static_cast<uint16_t>(rounded >> 13);
}

inline float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

// binary32 -> bfloat16 with round-to-nearest-even; NaN stays a (quiet) NaN.
inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace pagedkv::cpu_ops
