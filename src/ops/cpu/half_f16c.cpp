// fp16 -> fp32 rows with the F16C instruction (vcvtph2ps), used when the CPU has it; the
// portable bit-manipulation path in vec.h / half.h covers every other CPU.
#include "ops/cpu/half_f16c.h"

#include "ops/cpu/half.h"

#if PAGEDKV_HAVE_F16C_PATH
#include <immintrin.h>

namespace pagedkv::cpu_ops {

__attribute__((target("avx,f16c"))) void half_row_to_float_f16c(const uint16_t* src, float* dst,
                                                                int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}

const bool kHasF16C = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");

}  // namespace pagedkv::cpu_ops
#endif
