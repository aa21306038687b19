// Python bindings of the MoE ops (pagedkv._C.moe_*); arrays as in bind_ops.cpp (InArray /
// OutArray, never copied, named in errors). The Python layer (pagedkv/ops.py) allocates the
// outputs and fills the caller's CUDA stream.
#include <nanobind/stl/optional.h>

#include <optional>

#include "pagedkv/moe.h"
#include "python/bindings.h"
#include "python/tensor_caster.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace pagedkv::python {

void bind_moe(nb::module_& m) {
  m.def(
      "moe_topk_softmax",
      [](OutArray topk_weights, OutArray topk_ids, InArray gating_output, bool renormalize,
         uintptr_t stream) {
        const TensorView w = to_view(topk_weights, "topk_weights");
        const TensorView ids = to_view(topk_ids, "topk_ids");
        const TensorView g = to_view(gating_output, "gating_output");
        nb::gil_scoped_release release;
        ops::topk_softmax(w, ids, g, renormalize, to_stream(stream));
      },
      "topk_weights"_a.noconvert(), "topk_ids"_a.noconvert(), "gating_output"_a,
      "renormalize"_a, "stream"_a = 0,
      "Softmax over the experts, then the top-k weights [T, k] float32 and ids [T, k] int32.");

  m.def("moe_max_padded_tokens", &ops::moe_max_padded_tokens, "num_pairs"_a, "num_experts"_a,
        "block_size"_a, "Length of sorted_token_ids for moe_align_block_size.");

  m.def(
      "moe_align_block_size",
      [](InArray topk_ids, int num_experts, int block_size, OutArray sorted_token_ids,
         OutArray expert_ids, OutArray num_tokens_post_pad, uintptr_t stream) {
        const TensorView ids = to_view(topk_ids, "topk_ids");
        const TensorView s = to_view(sorted_token_ids, "sorted_token_ids");
        const TensorView e = to_view(expert_ids, "expert_ids");
        const TensorView n = to_view(num_tokens_post_pad, "num_tokens_post_pad");
        nb::gil_scoped_release release;
        ops::moe_align_block_size(ids, num_experts, block_size, s, e, n, to_stream(stream));
      },
      "topk_ids"_a, "num_experts"_a, "block_size"_a, "sorted_token_ids"_a.noconvert(),
      "expert_ids"_a.noconvert(), "num_tokens_post_pad"_a.noconvert(), "stream"_a = 0,
      "Sorts the (token, slot) pairs by expert into groups padded to block_size.");

  m.def(
      "moe_grouped_gemm",
      [](OutArray out, InArray a, InArray w, InArray sorted_token_ids, InArray expert_ids,
         InArray num_tokens_post_pad, int top_k, int block_size,
         std::optional<InArray> topk_weights, uintptr_t stream) {
        const TensorView o = to_view(out, "out"), va = to_view(a, "a"), vw = to_view(w, "w");
        const TensorView s = to_view(sorted_token_ids, "sorted_token_ids");
        const TensorView e = to_view(expert_ids, "expert_ids");
        const TensorView n = to_view(num_tokens_post_pad, "num_tokens_post_pad");
        const std::optional<TensorView> tw = to_view(topk_weights, "topk_weights");
        nb::gil_scoped_release release;
        ops::moe_grouped_gemm(o, va, vw, s, e, n, top_k, block_size, tw, to_stream(stream));
      },
      "out"_a.noconvert(), "a"_a, "w"_a, "sorted_token_ids"_a, "expert_ids"_a,
      "num_tokens_post_pad"_a, "top_k"_a, "block_size"_a, "topk_weights"_a.none(),
      "stream"_a = 0,
      "Grouped GEMM over the expert blocks: out[i] = a[i / top_k] . w[expert]^T "
      "(* topk_weights[i]).");
}

}  // namespace pagedkv::python
