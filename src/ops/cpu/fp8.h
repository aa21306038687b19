// fp8 e4m3 ("fn": no infinities, 0x7f/0xff = NaN, max 448) and e5m2 (IEEE-like, max 57344)
// encode/decode for KV caches stored as uint8. Writes store value / scale, saturated to the
// largest finite value and rounded to nearest even; reads return stored * scale.
#pragma once

#include <cstdint>

#include "pagedkv/ops.h"

namespace pagedkv::cpu_ops {

enum class Fp8Format : uint8_t { kE4M3, kE5M2 };

inline Fp8Format fp8_format(KVCacheDType d) {
  return d == KVCacheDType::kFp8E5M2 ? Fp8Format::kE5M2 : Fp8Format::kE4M3;
}

uint8_t float_to_fp8(float v, Fp8Format fmt);
float fp8_to_float(uint8_t code, Fp8Format fmt);

// The 256 decoded values of a format (table lookup is the fast read path).
const float* fp8_table(Fp8Format fmt);

}  // namespace pagedkv::cpu_ops
