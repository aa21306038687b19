// Weight-only int4 GEMM (AWQ / GPTQ checkpoints, repacked on loading into one layout):
//
//   out [M, N] = x [M, K] . W^T,   W[n, k] = (q[n, k] - zeros[n, g]) * scales[n, g],  g = k / G
//
//   x        [M, K] float32 / float16 / bfloat16, contiguous last dimension
//   qweight  [N, K / 2] uint8: q[n, 2j] in the low nibble of byte j, q[n, 2j + 1] in the high
//   scales   [N, K / G] x's dtype
//   zeros    [N, K / G] uint8 (0..15; 8 for a symmetric checkpoint)
//   out      [M, N] x's dtype (written); accumulated in fp32 from weights dequantised tile by
//            tile (never a dequantised copy of the whole matrix)
//   group_size G: even, divides K (K itself for one group per row)
//
// Validation as in include/pagedkv/ops.h: ValueError / TypeError naming the argument.
#pragma once

#include "pagedkv/tensor.h"

namespace pagedkv::ops {

void int4_gemm(const TensorView& out, const TensorView& x, const TensorView& qweight,
               const TensorView& scales, const TensorView& zeros, int group_size,
               Stream stream = nullptr);

}  // namespace pagedkv::ops
