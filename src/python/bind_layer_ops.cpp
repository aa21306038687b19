// Python bindings of the fused layer ops (pagedkv._C.ops_rms_norm, ...). Same conventions as
// bind_ops.cpp: InArray / OutArray arguments viewed without copies, the GIL released while the
// kernels run; the Python layer (pagedkv/layer_ops.py) adds vLLM's argument order and the
// caller's CUDA stream.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>

#include "pagedkv/layer_ops.h"
#include "python/bindings.h"
#include "python/tensor_caster.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace pagedkv::python {
namespace {

ops::GatedActivation parse_activation(const std::string& name) {
  if (name == "silu") return ops::GatedActivation::kSilu;
  if (name == "gelu") return ops::GatedActivation::kGelu;
  if (name == "gelu_tanh") return ops::GatedActivation::kGeluTanh;
  throw ValueError("activation must be 'silu', 'gelu' or 'gelu_tanh', got '" + name + "'");
}

}  // namespace

void bind_layer_ops(nb::module_& m) {
  m.def(
      "ops_rms_norm",
      [](OutArray out, InArray input, InArray weight, float epsilon, float weight_offset,
         uintptr_t stream) {
        const TensorView o = to_view(out, "out"), x = to_view(input, "input");
        const TensorView w = to_view(weight, "weight");
        nb::gil_scoped_release release;
        ops::rms_norm(o, x, w, epsilon, weight_offset, to_stream(stream));
      },
      "out"_a.noconvert(), "input"_a, "weight"_a, "epsilon"_a, "weight_offset"_a = 0.0f,
      "stream"_a = 0, "out = input / rms(input) * (weight_offset + weight), row by row.");

  m.def(
      "ops_fused_add_rms_norm",
      [](OutArray input, OutArray residual, InArray weight, float epsilon, float weight_offset,
         uintptr_t stream) {
        const TensorView x = to_view(input, "input"), r = to_view(residual, "residual");
        const TensorView w = to_view(weight, "weight");
        nb::gil_scoped_release release;
        ops::fused_add_rms_norm(x, r, w, epsilon, weight_offset, to_stream(stream));
      },
      "input"_a.noconvert(), "residual"_a.noconvert(), "weight"_a, "epsilon"_a,
      "weight_offset"_a = 0.0f, "stream"_a = 0,
      "In place: residual += input, then input = rms_norm(residual).");

  m.def(
      "ops_rotary_embedding",
      [](InArray positions, OutArray query, std::optional<OutArray> key, InArray cos_sin_cache,
         bool is_neox, uintptr_t stream) {
        const TensorView p = to_view(positions, "positions"), q = to_view(query, "query");
        std::optional<TensorView> k;
        if (key) k = to_view(*key, "key");
        const TensorView c = to_view(cos_sin_cache, "cos_sin_cache");
        nb::gil_scoped_release release;
        ops::rotary_embedding(p, q, k, c, is_neox, to_stream(stream));
      },
      "positions"_a, "query"_a.noconvert(), "key"_a.none().noconvert(), "cos_sin_cache"_a,
      "is_neox"_a, "stream"_a = 0,
      "Rotates query [T, Hq, D] and key [T, Hk, D] in place by cos_sin_cache[positions].");

  m.def(
      "ops_act_and_mul",
      [](const std::string& activation, OutArray out, InArray input, uintptr_t stream) {
        const ops::GatedActivation act = parse_activation(activation);
        const TensorView o = to_view(out, "out"), x = to_view(input, "input");
        nb::gil_scoped_release release;
        ops::act_and_mul(act, o, x, to_stream(stream));
      },
      "activation"_a, "out"_a.noconvert(), "input"_a, "stream"_a = 0,
      "out[..., d] = act(input[..., :d]) * input[..., d:] (act: silu, gelu, gelu_tanh).");
}

}  // namespace pagedkv::python
