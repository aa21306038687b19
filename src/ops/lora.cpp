// The multi-LoRA ops (include/pagedkv/lora.h): argument validation for both backends, then
// dispatch on the device of the arrays to the CPU kernels or, when built, the CUDA kernels.
#include "pagedkv/lora.h"

#include "ops/cpu/lora.h"
#include "ops/validate.h"
#ifdef PAGEDKV_WITH_CUDA
#include "ops/cuda/lora.h"
#endif

namespace pagedkv::ops {
namespace {

constexpr size_t kMaxSlices = 8;

// A 2-D array with a contiguous last dimension (rows may be strided).
void check_matrix(const TensorView& t, std::string_view name, int64_t rows, int64_t cols) {
  check_ndim(t, name, 2);
  check_shape(t, name, {rows, cols});
  PAGEDKV_CHECK(t.is_last_dim_contiguous(), name, " must have a contiguous last dimension");
}

// token_lora_indices [T] int32; on the host each value in [-1, num_loras).
void check_indices(const TensorView& idx, int64_t tokens, int64_t num_loras) {
  check_dtype(idx, "token_lora_indices", {DType::kInt32});
  check_ndim(idx, "token_lora_indices", 1);
  check_shape(idx, "token_lora_indices", {tokens});
  detail::check_cuda_dense(idx, "token_lora_indices");
  if (idx.device().is_cuda()) return;
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t l = idx.data_as<const int32_t>()[t * idx.stride(0)];
    PAGEDKV_CHECK(l >= -1 && l < num_loras, "token_lora_indices[", t, "] = ", l,
                  " is not -1 (no adapter) or an adapter slot in [0, ", num_loras, ")");
  }
}

#ifndef PAGEDKV_WITH_CUDA
[[noreturn]] void no_cuda(const char* op, const TensorView& t) {
  throw ValueError(::pagedkv::detail::concat(op, ": the arrays are on ", t.device().str(),
                                             " but pagedkv was built without CUDA"));
}
#endif

}  // namespace

void lora_shrink(const TensorView& buf, const TensorView& x, const TensorView& a,
                 const TensorView& token_lora_indices, Stream stream, LoRAVariant variant) {
  const detail::Named reads[] = {{&x, "x"}, {&a, "a"}, {&token_lora_indices, "token_lora_indices"}};
  detail::check_devices({reads[0], reads[1], reads[2], {&buf, "buf"}});
  detail::check_float(x, "x");
  check_ndim(x, "x", 2);
  check_ndim(a, "a", 3);
  const int64_t T = x.size(0), L = a.size(0), R = a.size(1), K = a.size(2);
  check_matrix(x, "x", T, K);
  check_dtype(a, "a", {x.dtype()});
  check_contiguous(a, "a");
  check_dtype(buf, "buf", {DType::kFloat32});
  check_matrix(buf, "buf", T, R);
  check_indices(token_lora_indices, T, L);
  detail::check_no_self_overlap(buf, "buf");
  detail::check_no_overlap({&buf, "buf"}, reads);
  if (T == 0 || R == 0) return;
  if (!x.device().is_cuda()) return cpu_ops::lora_shrink(buf, x, a, token_lora_indices);
#ifdef PAGEDKV_WITH_CUDA
  cuda_ops::lora_shrink(buf, x, a, token_lora_indices, stream, variant);
#else
  (void)stream;
  (void)variant;
  no_cuda("lora_shrink", x);
#endif
}

void lora_expand(const TensorView& out, const TensorView& buf, const TensorView& b,
                 const TensorView& token_lora_indices, const std::vector<int64_t>& slice_sizes,
                 Stream stream, LoRAVariant variant) {
  const detail::Named reads[] = {
      {&buf, "buf"}, {&b, "b"}, {&token_lora_indices, "token_lora_indices"}};
  detail::check_devices({{&out, "out"}, reads[0], reads[1], reads[2]});
  detail::check_float(out, "out");
  check_ndim(out, "out", 2);
  check_ndim(b, "b", 3);
  const int64_t T = out.size(0), L = b.size(0), N = b.size(1), r = b.size(2);
  check_matrix(out, "out", T, N);
  check_dtype(b, "b", {out.dtype()});
  check_contiguous(b, "b");
  PAGEDKV_CHECK(!slice_sizes.empty() && slice_sizes.size() <= kMaxSlices, "slice_sizes has ",
                slice_sizes.size(), " entries; 1 to ", kMaxSlices, " are supported");
  int64_t total = 0;
  for (int64_t s : slice_sizes) {
    PAGEDKV_CHECK(s > 0, "slice_sizes must be positive, got ", s);
    total += s;
  }
  PAGEDKV_CHECK(total == N, "slice_sizes sum to ", total, " but out and b have ", N, " columns");
  check_dtype(buf, "buf", {DType::kFloat32});
  check_matrix(buf, "buf", T, static_cast<int64_t>(slice_sizes.size()) * r);
  check_indices(token_lora_indices, T, L);
  detail::check_no_self_overlap(out, "out");
  detail::check_no_overlap({&out, "out"}, reads);
  if (T == 0 || r == 0) return;
  if (!out.device().is_cuda())
    return cpu_ops::lora_expand(out, buf, b, token_lora_indices, slice_sizes);
#ifdef PAGEDKV_WITH_CUDA
  cuda_ops::lora_expand(out, buf, b, token_lora_indices, slice_sizes, stream, variant);
#else
  (void)stream;
  (void)variant;
  no_cuda("lora_expand", out);
#endif
}

}  // namespace pagedkv::ops
