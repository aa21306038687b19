// CUDA kernel of the int4 GEMM (include/pagedkv/quant.h); arguments validated by
// src/ops/quant.cpp. Enqueued on `stream` without sync or allocation (CUDA-graph safe).
#pragma once

#include "pagedkv/quant.h"

namespace pagedkv::cuda_ops {

void int4_gemm(const TensorView& out, const TensorView& x, const TensorView& qweight,
               const TensorView& scales, const TensorView& zeros, int group_size, Stream stream);

}  // namespace pagedkv::cuda_ops
