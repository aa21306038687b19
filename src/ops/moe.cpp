// The MoE ops (include/pagedkv/moe.h): argument validation for both backends, then dispatch on
// the device of the arrays to the CPU kernels or, when built, the CUDA kernels.
#include "pagedkv/moe.h"

#include <string>

#include "ops/cpu/moe.h"
#include "ops/validate.h"
#ifdef PAGEDKV_WITH_CUDA
#include "ops/cuda/moe.h"
#endif

namespace pagedkv::ops {
namespace {

// Runs the CUDA kernel for GPU arrays (when built with CUDA), the CPU kernel otherwise.
template <typename Cpu, typename Cuda>
void dispatch(const TensorView& first, const char* op, Cpu cpu, Cuda cuda) {
  if (!first.device().is_cuda()) return cpu();
#ifdef PAGEDKV_WITH_CUDA
  (void)op;
  cuda();
#else
  (void)cuda;
  throw ValueError(::pagedkv::detail::concat(op, ": the arrays are on ", first.device().str(),
                                             " but pagedkv was built without CUDA"));
#endif
}

// A 2-D array with a contiguous last dimension (rows may be strided).
void check_matrix(const TensorView& t, std::string_view name, int64_t rows, int64_t cols) {
  check_shape(t, name, {rows, cols});
  PAGEDKV_CHECK(t.is_last_dim_contiguous(), name, " must have a contiguous last dimension");
}

void check_block_size(int block_size) {
  PAGEDKV_CHECK(block_size > 0 && block_size <= 1024, "block_size = ", block_size,
                " must be in [1, 1024]");
}

}  // namespace

void topk_softmax(const TensorView& topk_weights, const TensorView& topk_ids,
                  const TensorView& gating_output, bool renormalize, Stream stream) {
  detail::check_devices(
      {{&gating_output, "gating_output"}, {&topk_weights, "topk_weights"}, {&topk_ids, "topk_ids"}});
  detail::check_float(gating_output, "gating_output");
  check_ndim(gating_output, "gating_output", 2);
  PAGEDKV_CHECK(gating_output.is_last_dim_contiguous(),
                "gating_output must have a contiguous last dimension");
  const int64_t T = gating_output.size(0), E = gating_output.size(1);
  check_dtype(topk_weights, "topk_weights", {DType::kFloat32});
  check_dtype(topk_ids, "topk_ids", {DType::kInt32});
  check_ndim(topk_ids, "topk_ids", 2);
  const int64_t k = topk_ids.size(1);
  PAGEDKV_CHECK(k >= 1 && k <= E, "topk_ids has ", k, " columns (top_k) but there are ", E,
                " experts: top_k must be in [1, num_experts]");
  PAGEDKV_CHECK(E <= 1024, "gating_output has ", E, " experts; at most 1024 are supported");
  check_shape(topk_ids, "topk_ids", {T, k});
  check_shape(topk_weights, "topk_weights", {T, k});
  for (const auto& [t, name] : {std::pair{&topk_weights, "topk_weights"}, {&topk_ids, "topk_ids"}})
    detail::check_no_self_overlap(*t, name);
  detail::check_no_overlap({&topk_weights, "topk_weights"},
                           {{&gating_output, "gating_output"}, {&topk_ids, "topk_ids"}});
  detail::check_no_overlap({&topk_ids, "topk_ids"}, {{&gating_output, "gating_output"}});
  if (T == 0) return;
  dispatch(
      gating_output, "topk_softmax",
      [&] { cpu_ops::topk_softmax(topk_weights, topk_ids, gating_output, renormalize); },
      [&] {
#ifdef PAGEDKV_WITH_CUDA
        cuda_ops::topk_softmax(topk_weights, topk_ids, gating_output, renormalize, stream);
#endif
      });
  (void)stream;
}

int64_t moe_max_padded_tokens(int64_t num_pairs, int64_t num_experts, int64_t block_size) {
  PAGEDKV_CHECK(num_pairs >= 0 && num_experts > 0 && block_size > 0,
                "moe_max_padded_tokens: num_pairs >= 0, num_experts > 0 and block_size > 0, got ",
                num_pairs, ", ", num_experts, ", ", block_size);
  const int64_t worst = num_pairs + num_experts * (block_size - 1);
  return (worst + block_size - 1) / block_size * block_size;
}

void moe_align_block_size(const TensorView& topk_ids, int num_experts, int block_size,
                          const TensorView& sorted_token_ids, const TensorView& expert_ids,
                          const TensorView& num_tokens_post_pad, Stream stream) {
  detail::check_devices({{&topk_ids, "topk_ids"},
                         {&sorted_token_ids, "sorted_token_ids"},
                         {&expert_ids, "expert_ids"},
                         {&num_tokens_post_pad, "num_tokens_post_pad"}});
  check_dtype(topk_ids, "topk_ids", {DType::kInt32});
  check_ndim(topk_ids, "topk_ids", 2);
  PAGEDKV_CHECK(num_experts > 0 && num_experts <= 4096, "num_experts = ", num_experts,
                " must be in [1, 4096]");
  check_block_size(block_size);
  const int64_t pairs = topk_ids.size(0) * topk_ids.size(1);
  PAGEDKV_CHECK(pairs < (int64_t{1} << 30), "topk_ids has ", pairs, " entries (at most 2^30)");
  const int64_t need = moe_max_padded_tokens(pairs, num_experts, block_size);
  const detail::Named written[] = {{&sorted_token_ids, "sorted_token_ids"},
                                   {&expert_ids, "expert_ids"},
                                   {&num_tokens_post_pad, "num_tokens_post_pad"}};
  for (const detail::Named& o : written) {
    check_dtype(*o.t, o.name, {DType::kInt32});
    check_ndim(*o.t, o.name, 1);
    detail::check_cuda_dense(*o.t, o.name);
    detail::check_no_self_overlap(*o.t, o.name);
    detail::check_no_overlap(o, {{&topk_ids, "topk_ids"}});
  }
  detail::check_no_overlap(written[0], {written[1], written[2]});
  detail::check_no_overlap(written[1], {written[2]});
  PAGEDKV_CHECK(sorted_token_ids.size(0) >= need, "sorted_token_ids has ",
                sorted_token_ids.size(0), " entries but ", pairs, " pairs over ", num_experts,
                " experts in blocks of ", block_size, " need ", need,
                " (moe_max_padded_tokens)");
  PAGEDKV_CHECK(expert_ids.size(0) >= sorted_token_ids.size(0) / block_size, "expert_ids has ",
                expert_ids.size(0), " entries but sorted_token_ids holds ",
                sorted_token_ids.size(0) / block_size, " blocks");
  check_shape(num_tokens_post_pad, "num_tokens_post_pad", {1});
  if (!topk_ids.device().is_cuda()) {
    for (int64_t t = 0; t < topk_ids.size(0); ++t)
      for (int64_t j = 0; j < topk_ids.size(1); ++j) {
        const int64_t e = topk_ids.data_as<const int32_t>()[t * topk_ids.stride(0) +
                                                            j * topk_ids.stride(1)];
        PAGEDKV_CHECK(e >= 0 && e < num_experts, "topk_ids[", t, ", ", j, "] = ", e,
                      " is not an expert id in [0, num_experts = ", num_experts, ")");
      }
  }
  dispatch(
      topk_ids, "moe_align_block_size",
      [&] {
        cpu_ops::moe_align_block_size(topk_ids, num_experts, block_size, sorted_token_ids,
                                      expert_ids, num_tokens_post_pad);
      },
      [&] {
#ifdef PAGEDKV_WITH_CUDA
        cuda_ops::moe_align_block_size(topk_ids, num_experts, block_size, sorted_token_ids,
                                       expert_ids, num_tokens_post_pad, stream);
#endif
      });
  (void)stream;
}

void moe_grouped_gemm(const TensorView& out, const TensorView& a, const TensorView& w,
                      const TensorView& sorted_token_ids, const TensorView& expert_ids,
                      const TensorView& num_tokens_post_pad, int top_k, int block_size,
                      const std::optional<TensorView>& topk_weights, Stream stream) {
  const TensorView none;
  const TensorView& tw = topk_weights ? *topk_weights : a;
  const detail::Named reads[] = {{&a, "a"},
                                 {&w, "w"},
                                 {&sorted_token_ids, "sorted_token_ids"},
                                 {&expert_ids, "expert_ids"},
                                 {&num_tokens_post_pad, "num_tokens_post_pad"},
                                 {topk_weights ? &tw : &none, "topk_weights"}};
  detail::check_devices({reads[0], {&out, "out"}});
  detail::check_devices({reads[0], reads[1], reads[2], reads[3], reads[4], {&tw, "topk_weights"}});
  detail::check_float(a, "a");
  check_ndim(a, "a", 2);
  check_ndim(w, "w", 3);
  const int64_t E = w.size(0), N = w.size(1), K = w.size(2);
  check_matrix(a, "a", -1, K);
  check_dtype(w, "w", {a.dtype()});
  check_contiguous(w, "w");
  check_dtype(out, "out", {a.dtype()});
  check_ndim(out, "out", 2);
  check_matrix(out, "out", -1, N);
  PAGEDKV_CHECK(top_k >= 1, "top_k = ", top_k, " must be >= 1");
  PAGEDKV_CHECK(a.size(0) * top_k == out.size(0), "out has ", out.size(0),
                " rows but a has ", a.size(0), " rows and top_k = ", top_k,
                " (out rows = a rows * top_k)");
  check_block_size(block_size);
  PAGEDKV_CHECK(!a.device().is_cuda() || block_size == 16 || block_size == 32 || block_size == 64,
                "block_size = ", block_size, ": the CUDA grouped GEMM takes 16, 32 or 64");
  for (const auto& [t, name] : {std::pair{&sorted_token_ids, "sorted_token_ids"},
                                {&expert_ids, "expert_ids"},
                                {&num_tokens_post_pad, "num_tokens_post_pad"}}) {
    check_dtype(*t, name, {DType::kInt32});
    check_ndim(*t, name, 1);
  }
  // The CPU kernel reads these with their strides; the CUDA one densely.
  detail::check_cuda_dense(sorted_token_ids, "sorted_token_ids");
  detail::check_cuda_dense(expert_ids, "expert_ids");
  check_shape(num_tokens_post_pad, "num_tokens_post_pad", {1});
  PAGEDKV_CHECK(expert_ids.size(0) * block_size >= sorted_token_ids.size(0), "expert_ids has ",
                expert_ids.size(0), " blocks but sorted_token_ids needs ",
                (sorted_token_ids.size(0) + block_size - 1) / block_size);
  if (topk_weights) {
    check_dtype(tw, "topk_weights", {DType::kFloat32});
    PAGEDKV_CHECK((tw.ndim() == 1 && tw.size(0) == out.size(0)) ||
                      (tw.ndim() == 2 && tw.size(0) * tw.size(1) == out.size(0)),
                  "topk_weights has shape ", tw.shape_str(), " but out has ", out.size(0),
                  " rows: it must be [rows] or [tokens, top_k]");
    detail::check_cuda_dense(tw, "topk_weights");
    PAGEDKV_CHECK(!tw.device().is_cuda() || tw.is_contiguous(),
                  "topk_weights must be contiguous on CUDA");
  }
  detail::check_no_self_overlap(out, "out");
  detail::check_no_overlap({&out, "out"}, reads);
  if (!a.device().is_cuda()) {
    const int64_t used = *num_tokens_post_pad.data_as<const int32_t>();
    PAGEDKV_CHECK(used >= 0 && used <= sorted_token_ids.size(0), "num_tokens_post_pad = ", used,
                  " must be in [0, len(sorted_token_ids) = ", sorted_token_ids.size(0), "]");
    for (int64_t b = 0; b < (used + block_size - 1) / block_size; ++b) {
      const int64_t e = expert_ids.data_as<const int32_t>()[b * expert_ids.stride(0)];
      PAGEDKV_CHECK(e < E, "expert_ids[", b, "] = ", e, " but w holds ", E, " experts");
    }
    for (int64_t r = 0; r < used; ++r) {
      const int64_t i = sorted_token_ids.data_as<const int32_t>()[r * sorted_token_ids.stride(0)];
      PAGEDKV_CHECK(i >= 0, "sorted_token_ids[", r, "] = ", i, " is negative");
    }
  }
  if (out.numel() == 0) return;
  dispatch(
      a, "moe_grouped_gemm",
      [&] {
        cpu_ops::moe_grouped_gemm(out, a, w, sorted_token_ids, expert_ids, num_tokens_post_pad,
                                  top_k, block_size, topk_weights);
      },
      [&] {
#ifdef PAGEDKV_WITH_CUDA
        cuda_ops::moe_grouped_gemm(out, a, w, sorted_token_ids, expert_ids, num_tokens_post_pad,
                                   top_k, block_size, topk_weights, stream);
#endif
      });
  (void)stream;
}

}  // namespace pagedkv::ops
