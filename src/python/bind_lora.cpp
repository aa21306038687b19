// Python bindings of the multi-LoRA ops (pagedkv._C.lora_*); arrays as in bind_ops.cpp (InArray /
// OutArray, never copied, named in errors). The Python layer (pagedkv/lora_ops.py) allocates
// the shrink buffer and fills the caller's CUDA stream.
#include <nanobind/stl/vector.h>

#include <vector>

#include "pagedkv/lora.h"
#include "python/bindings.h"
#include "python/tensor_caster.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace pagedkv::python {
namespace {

// The CUDA kernels' variant (tiled: ops::LoRAVariant::kTiled; the CPU kernels ignore it).
ops::LoRAVariant variant_of(bool tiled) {
  return tiled ? ops::LoRAVariant::kTiled : ops::LoRAVariant::kPerToken;
}

}  // namespace

void bind_lora(nb::module_& m) {
  m.def(
      "lora_shrink",
      [](OutArray buf, InArray x, InArray a, InArray token_lora_indices, uintptr_t stream,
         bool tiled) {
        const TensorView vb = to_view(buf, "buf"), vx = to_view(x, "x"), va = to_view(a, "a");
        const TensorView idx = to_view(token_lora_indices, "token_lora_indices");
        nb::gil_scoped_release release;
        ops::lora_shrink(vb, vx, va, idx, to_stream(stream), variant_of(tiled));
      },
      "buf"_a.noconvert(), "x"_a, "a"_a, "token_lora_indices"_a, "stream"_a = 0, "tiled"_a = false,
      "buf[t] = x[t] . a[token_lora_indices[t]]^T (zeros where the index is -1).");

  m.def(
      "lora_expand",
      [](OutArray out, InArray buf, InArray b, InArray token_lora_indices,
         const std::vector<int64_t>& slice_sizes, uintptr_t stream, bool tiled) {
        const TensorView vo = to_view(out, "out"), vbuf = to_view(buf, "buf");
        const TensorView vb = to_view(b, "b");
        const TensorView idx = to_view(token_lora_indices, "token_lora_indices");
        nb::gil_scoped_release release;
        ops::lora_expand(vo, vbuf, vb, idx, slice_sizes, to_stream(stream), variant_of(tiled));
      },
      "out"_a.noconvert(), "buf"_a, "b"_a, "token_lora_indices"_a, "slice_sizes"_a, "stream"_a = 0,
      "tiled"_a = false,
      "out[t, n] += buf[t, slice(n)] . b[token_lora_indices[t], n] (rows with index -1 kept).");
}

}  // namespace pagedkv::python
