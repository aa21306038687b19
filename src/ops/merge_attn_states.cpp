// merge_attn_states (include/pagedkv/ops.h): argument checks for both backends, then dispatch.
#include "ops/cpu/cpu_ops.h"
#include "ops/validate.h"
#include "pagedkv/ops.h"
#ifdef PAGEDKV_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace pagedkv::ops {

void merge_attn_states(const TensorView& output, const std::optional<TensorView>& output_lse,
                       const TensorView& prefix_output, const TensorView& prefix_lse,
                       const TensorView& suffix_output, const TensorView& suffix_lse,
                       Stream stream) {
  const TensorView& olse = output_lse ? *output_lse : prefix_lse;
  detail::check_devices({{&output, "output"},
                         {&prefix_output, "prefix_output"},
                         {&prefix_lse, "prefix_lse"},
                         {&suffix_output, "suffix_output"},
                         {&suffix_lse, "suffix_lse"},
                         {&olse, "output_lse"}});
  detail::check_float(output, "output");
  detail::check_rows(output, "output", -1, -1, -1);
  const int64_t T = output.size(0), H = output.size(1), D = output.size(2);
  for (const detail::Named& o : {detail::Named{&prefix_output, "prefix_output"},
                                 detail::Named{&suffix_output, "suffix_output"}}) {
    detail::check_rows(*o.t, o.name, T, H, D);
    check_dtype(*o.t, o.name, {output.dtype()});
  }
  for (const detail::Named& l :
       {detail::Named{&prefix_lse, "prefix_lse"}, detail::Named{&suffix_lse, "suffix_lse"},
        detail::Named{&olse, "output_lse"}}) {
    check_dtype(*l.t, l.name, {DType::kFloat32});
    check_shape(*l.t, l.name, {H, T});
    check_contiguous(*l.t, l.name);
  }
  detail::check_no_self_overlap(output, "output");
  detail::check_no_overlap({&output, "output"}, {{&prefix_output, "prefix_output"},
                                                 {&prefix_lse, "prefix_lse"},
                                                 {&suffix_output, "suffix_output"},
                                                 {&suffix_lse, "suffix_lse"}});
  if (output_lse) {
    detail::check_no_overlap({&olse, "output_lse"}, {{&output, "output"},
                                                     {&prefix_output, "prefix_output"},
                                                     {&prefix_lse, "prefix_lse"},
                                                     {&suffix_output, "suffix_output"},
                                                     {&suffix_lse, "suffix_lse"}});
  }
  if (output.numel() == 0) return;
#ifdef PAGEDKV_WITH_CUDA
  if (output.device().is_cuda()) {
    cuda_ops::merge_attn_states(output, output_lse, prefix_output, prefix_lse, suffix_output,
                                suffix_lse, stream);
    return;
  }
#else
  PAGEDKV_CHECK(!output.device().is_cuda(), "merge_attn_states: the arrays are on ",
                output.device().str(), " but pagedkv was built without CUDA");
#endif
  (void)stream;
  cpu_ops::merge_attn_states(output, output_lse, prefix_output, prefix_lse, suffix_output,
                             suffix_lse);
}

}  // namespace pagedkv::ops
