// fp8 conversions: the encoder rounds on the float's exponent grid with the FPU in its default
// round-to-nearest-even mode; the decoder is a closed formula tabulated once per format.
#include "ops/cpu/fp8.h"

#include <array>
#include <cmath>
#include <limits>

namespace pagedkv::cpu_ops {
namespace {

struct Fp8Spec {
  int mant_bits;  // M
  int bias;       // B
  float max_finite;
};

constexpr Fp8Spec spec(Fp8Format fmt) {
  return fmt == Fp8Format::kE4M3 ? Fp8Spec{3, 7, 448.0f} : Fp8Spec{2, 15, 57344.0f};
}

float decode(uint8_t code, Fp8Format fmt) {
  const Fp8Spec s = spec(fmt);
  const int exp_bits = 7 - s.mant_bits;
  const bool neg = code & 0x80;
  const int e = (code >> s.mant_bits) & ((1 << exp_bits) - 1);
  const int m = code & ((1 << s.mant_bits) - 1);
  float mag;
  if (fmt == Fp8Format::kE4M3 && e == 15 && m == 7) {
    mag = std::numeric_limits<float>::quiet_NaN();
  } else if (fmt == Fp8Format::kE5M2 && e == 31) {
    mag = m == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else if (e == 0) {
    mag = std::ldexp(static_cast<float>(m), 1 - s.bias - s.mant_bits);
  } else {
    mag = std::ldexp(static_cast<float>(m + (1 << s.mant_bits)), e - s.bias - s.mant_bits);
  }
  return neg ? -mag : mag;
}

std::array<float, 256> make_table(Fp8Format fmt) {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) t[c] = decode(static_cast<uint8_t>(c), fmt);
  return t;
}

}  // namespace

const float* fp8_table(Fp8Format fmt) {
  static const std::array<float, 256> e4m3 = make_table(Fp8Format::kE4M3);
  static const std::array<float, 256> e5m2 = make_table(Fp8Format::kE5M2);
  return fmt == Fp8Format::kE4M3 ? e4m3.data() : e5m2.data();
}

float fp8_to_float(uint8_t code, Fp8Format fmt) { return fp8_table(fmt)[code]; }

uint8_t float_to_fp8(float v, Fp8Format fmt) {
  const Fp8Spec s = spec(fmt);
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  if (std::isnan(v)) return fmt == Fp8Format::kE4M3 ? 0x7f : 0x7e;  // canonical quiet NaN
  float a = std::fabs(v);
  // Exponent of the quantum: the value's own binade, clamped to the subnormal binade.
  int e2 = 0;
  std::frexp(a, &e2);  // a = f * 2^e2 with f in [0.5, 1): binade exponent is e2 - 1
  const int min_exp = 1 - s.bias;
  const int binade = a == 0.0f ? min_exp : std::max(e2 - 1, min_exp);
  const int quantum_exp = binade - s.mant_bits;
  // Rounded multiple of the quantum (ldexp by a power of two is exact; nearbyint rounds to even).
  float q = std::nearbyint(std::ldexp(a, -quantum_exp));
  a = std::ldexp(q, quantum_exp);
  if (!(a <= s.max_finite)) a = s.max_finite;  // saturate (also +-inf)
  if (a == 0.0f) return sign;
  // Re-encode the (exactly representable) rounded magnitude.
  std::frexp(a, &e2);
  int e = std::max(e2 - 1, min_exp);
  const int biased = a < std::ldexp(1.0f, min_exp) ? 0 : e + s.bias;
  const int mant = static_cast<int>(std::ldexp(a, s.mant_bits - e)) & ((1 << s.mant_bits) - 1);
  return sign | static_cast<uint8_t>((biased << s.mant_bits) | mant);
}

}  // namespace pagedkv::cpu_ops
