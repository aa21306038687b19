// Hardware fp16 -> fp32 conversion of a row (x86 F16C), selected at run time.
#pragma once

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__)
#define PAGEDKV_HAVE_F16C_PATH 1
#else
#define PAGEDKV_HAVE_F16C_PATH 0
#endif

namespace pagedkv::cpu_ops {
#if PAGEDKV_HAVE_F16C_PATH
extern const bool kHasF16C;  // the CPU supports F16C (and AVX)
void half_row_to_float_f16c(const uint16_t* src, float* dst, int n);
#endif
}  // namespace pagedkv::cpu_ops
