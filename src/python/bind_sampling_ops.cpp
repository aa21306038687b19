// Python bindings of the sampling ops (pagedkv._C.ops_top_k_top_p_threshold,
// ops_sample_exponential_race); conventions of
// bind_ops.cpp. The Python layer is pagedkv/sampling_ops.py.
#include "pagedkv/sampling_ops.h"
#include "python/bindings.h"
#include "python/tensor_caster.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace pagedkv::python {

void bind_sampling_ops(nb::module_& m) {
  m.def(
      "ops_top_k_top_p_threshold",
      [](OutArray thresholds, InArray probs, InArray top_k, InArray top_p, InArray min_p,
         uintptr_t stream) {
        const TensorView t = to_view(thresholds, "thresholds"), p = to_view(probs, "probs");
        const TensorView k = to_view(top_k, "top_k"), tp = to_view(top_p, "top_p");
        const TensorView mp = to_view(min_p, "min_p");
        nb::gil_scoped_release release;
        ops::top_k_top_p_threshold(t, p, k, tp, mp, to_stream(stream));
      },
      "thresholds"_a.noconvert(), "probs"_a, "top_k"_a, "top_p"_a, "min_p"_a, "stream"_a = 0,
      "Per row of probs, the value above which top-k / top-p / min-p sampling keeps tokens.");

  m.def(
      "ops_sample_exponential_race",
      [](OutArray tokens, InArray probs, InArray thresholds, InArray keys, uintptr_t stream) {
        const TensorView t = to_view(tokens, "tokens"), p = to_view(probs, "probs");
        const TensorView th = to_view(thresholds, "thresholds"), k = to_view(keys, "keys");
        nb::gil_scoped_release release;
        ops::sample_exponential_race(t, p, th, k, to_stream(stream));
      },
      "tokens"_a.noconvert(), "probs"_a, "thresholds"_a, "keys"_a, "stream"_a = 0,
      "One token per row of probs (those >= thresholds), by the exponential race keyed by keys.");
}

}  // namespace pagedkv::python
