// CPU kernel of the int4 GEMM (include/pagedkv/quant.h); arguments validated by src/ops/quant.cpp.
#pragma once

#include "pagedkv/quant.h"

namespace pagedkv::cpu_ops {

void int4_gemm(const TensorView& out, const TensorView& x, const TensorView& qweight,
               const TensorView& scales, const TensorView& zeros, int group_size);

}  // namespace pagedkv::cpu_ops
