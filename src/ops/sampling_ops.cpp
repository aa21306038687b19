// The sampling ops (include/pagedkv/sampling_ops.h): validation once for both backends, then the
// CPU or CUDA kernel by the arrays' device.
#include "pagedkv/sampling_ops.h"

#include <utility>

#include "ops/cpu/sampling_ops.h"
#include "ops/dispatch.h"
#include "ops/validate.h"
#ifdef PAGEDKV_WITH_CUDA
#include "ops/cuda/sampling_ops.h"
#endif

namespace pagedkv::ops {

void top_k_top_p_threshold(const TensorView& thresholds, const TensorView& probs,
                           const TensorView& top_k, const TensorView& top_p,
                           const TensorView& min_p, Stream stream) {
  const detail::Named reads[] = {
      {&probs, "probs"}, {&top_k, "top_k"}, {&top_p, "top_p"}, {&min_p, "min_p"}};
  detail::check_devices({reads[0], {&thresholds, "thresholds"}});
  detail::check_devices(reads);
  check_dtype(probs, "probs", {DType::kFloat32});
  check_ndim(probs, "probs", 2);
  PAGEDKV_CHECK(probs.is_last_dim_contiguous(), "probs must be contiguous in its last dimension");
  const int64_t rows = probs.size(0);
  check_dtype(top_k, "top_k", {DType::kInt32});
  check_shape(top_k, "top_k", {rows});
  for (const auto& [t, name] : {std::pair{&top_p, "top_p"}, {&min_p, "min_p"},
                                {&thresholds, "thresholds"}}) {
    check_dtype(*t, name, {DType::kFloat32});
    check_shape(*t, name, {rows});
  }
  for (const detail::Named& a : reads) detail::check_cuda_dense(*a.t, a.name);
  detail::check_cuda_dense(thresholds, "thresholds");
  detail::check_no_self_overlap(thresholds, "thresholds");
  detail::check_no_overlap({&thresholds, "thresholds"}, reads);
  if (!probs.device().is_cuda()) {
    for (int64_t b = 0; b < rows; ++b) {
      const float p = top_p.data_as<const float>()[b * top_p.stride(0)];
      const float m = min_p.data_as<const float>()[b * min_p.stride(0)];
      PAGEDKV_CHECK(p > 0.0f && p <= 1.0f, "top_p[", b, "] = ", p, " must be in (0, 1]");
      PAGEDKV_CHECK(m >= 0.0f && m <= 1.0f, "min_p[", b, "] = ", m, " must be in [0, 1]");
    }
  }
  detail::dispatch(
      probs, rows * probs.size(1), "top_k_top_p_threshold",
      [&] { cpu_ops::top_k_top_p_threshold(thresholds, probs, top_k, top_p, min_p); },
      [&] {
#ifdef PAGEDKV_WITH_CUDA
        cuda_ops::top_k_top_p_threshold(thresholds, probs, top_k, top_p, min_p, stream);
#endif
      });
  (void)stream;
}

void sample_exponential_race(const TensorView& tokens, const TensorView& probs,
                             const TensorView& thresholds, const TensorView& keys,
                             Stream stream) {
  const detail::Named reads[] = {{&probs, "probs"}, {&thresholds, "thresholds"}, {&keys, "keys"}};
  detail::check_devices({reads[0], {&tokens, "tokens"}});
  detail::check_devices(reads);
  check_dtype(probs, "probs", {DType::kFloat32});
  check_ndim(probs, "probs", 2);
  PAGEDKV_CHECK(probs.is_last_dim_contiguous(), "probs must be contiguous in its last dimension");
  const int64_t rows = probs.size(0);
  check_dtype(thresholds, "thresholds", {DType::kFloat32});
  check_shape(thresholds, "thresholds", {rows});
  check_dtype(keys, "keys", {DType::kInt64});
  check_shape(keys, "keys", {rows});
  check_dtype(tokens, "tokens", {DType::kInt64});
  check_shape(tokens, "tokens", {rows});
  for (const detail::Named& a : reads) detail::check_cuda_dense(*a.t, a.name);
  detail::check_cuda_dense(tokens, "tokens");
  detail::check_no_self_overlap(tokens, "tokens");
  detail::check_no_overlap({&tokens, "tokens"}, reads);
  PAGEDKV_CHECK(rows == 0 || probs.size(1) > 0, "probs has no columns: there is no token to draw");
  detail::dispatch(
      probs, rows, "sample_exponential_race",
      [&] { cpu_ops::sample_exponential_race(tokens, probs, thresholds, keys); },
      [&] {
#ifdef PAGEDKV_WITH_CUDA
        cuda_ops::sample_exponential_race(tokens, probs, thresholds, keys, stream);
#endif
      });
  (void)stream;
}

}  // namespace pagedkv::ops
