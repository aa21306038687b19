// The int4 GEMM (include/pagedkv/quant.h): argument validation for both backends, then dispatch
// on the device of the arrays to the CPU kernel or, when built, the CUDA kernel.
#include "pagedkv/quant.h"

#include "ops/cpu/quant.h"
#include "ops/validate.h"
#ifdef PAGEDKV_WITH_CUDA
#include "ops/cuda/quant.h"
#endif

namespace pagedkv::ops {

void int4_gemm(const TensorView& out, const TensorView& x, const TensorView& qweight,
               const TensorView& scales, const TensorView& zeros, int group_size, Stream stream) {
  const detail::Named reads[] = {
      {&x, "x"}, {&qweight, "qweight"}, {&scales, "scales"}, {&zeros, "zeros"}};
  detail::check_devices({reads[0], {&out, "out"}});
  detail::check_devices(reads);
  detail::check_float(x, "x");
  check_ndim(x, "x", 2);
  PAGEDKV_CHECK(x.is_last_dim_contiguous(), "x must have a contiguous last dimension");
  const int64_t M = x.size(0), K = x.size(1);
  check_dtype(qweight, "qweight", {DType::kUInt8});
  check_ndim(qweight, "qweight", 2);
  check_contiguous(qweight, "qweight");
  const int64_t N = qweight.size(0);
  PAGEDKV_CHECK(group_size > 0 && group_size % 2 == 0 && K % group_size == 0,
                "group_size = ", group_size, " must be even and divide K = ", K);
  check_shape(qweight, "qweight", {N, K / 2});
  check_dtype(scales, "scales", {x.dtype()});
  check_shape(scales, "scales", {N, K / group_size});
  check_contiguous(scales, "scales");
  check_dtype(zeros, "zeros", {DType::kUInt8});
  check_shape(zeros, "zeros", {N, K / group_size});
  check_contiguous(zeros, "zeros");
  check_dtype(out, "out", {x.dtype()});
  check_shape(out, "out", {M, N});
  PAGEDKV_CHECK(out.is_last_dim_contiguous(), "out must have a contiguous last dimension");
  detail::check_no_self_overlap(out, "out");
  detail::check_no_overlap({&out, "out"}, reads);
  if (out.numel() == 0) return;
  if (K == 0) throw ValueError("int4_gemm: K = 0 (x has no columns)");
  if (!x.device().is_cuda()) return cpu_ops::int4_gemm(out, x, qweight, scales, zeros, group_size);
#ifdef PAGEDKV_WITH_CUDA
  cuda_ops::int4_gemm(out, x, qweight, scales, zeros, group_size, stream);
#else
  (void)stream;
  throw ValueError(::pagedkv::detail::concat("int4_gemm: the arrays are on ", x.device().str(),
                                             " but pagedkv was built without CUDA"));
#endif
}

}  // namespace pagedkv::ops
