// Python binding of the int4 GEMM (pagedkv._C.quant_int4_gemm); arrays as in bind_ops.cpp.
#include "pagedkv/quant.h"
#include "python/bindings.h"
#include "python/tensor_caster.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace pagedkv::python {

void bind_quant(nb::module_& m) {
  m.def(
      "quant_int4_gemm",
      [](OutArray out, InArray x, InArray qweight, InArray scales, InArray zeros, int group_size,
         uintptr_t stream) {
        const TensorView o = to_view(out, "out"), vx = to_view(x, "x");
        const TensorView q = to_view(qweight, "qweight"), s = to_view(scales, "scales");
        const TensorView z = to_view(zeros, "zeros");
        nb::gil_scoped_release release;
        ops::int4_gemm(o, vx, q, s, z, group_size, to_stream(stream));
      },
      "out"_a.noconvert(), "x"_a, "qweight"_a, "scales"_a, "zeros"_a, "group_size"_a,
      "stream"_a = 0,
      "out [M, N] = x [M, K] . W^T with W[n, k] = (q[n, k] - zeros[n, k / G]) * scales[n, k / G] "
      "(qweight [N, K / 2] uint8, two 4-bit codes per byte, low nibble first).");
}

}  // namespace pagedkv::python
