// The fused layer ops (include/pagedkv/layer_ops.h): validate every argument once for both
// backends, then run the CPU or CUDA kernel by the arrays' device.
#include "pagedkv/layer_ops.h"

#include <cmath>
#include <cstdint>

#include "ops/cpu/layer_ops.h"
#include "ops/dispatch.h"
#include "ops/validate.h"
#ifdef PAGEDKV_WITH_CUDA
#include "ops/cuda/layer_ops.h"
#endif

namespace pagedkv::ops {
namespace {

using detail::dispatch;

// A rank-1..3 float array with a contiguous last dimension (the rows of layer_rows.h).
void check_layer_rows(const TensorView& t, std::string_view name) {
  detail::check_float(t, name);
  PAGEDKV_CHECK(t.ndim() >= 1 && t.ndim() <= 3, name, " must have rank 1, 2 or 3, got shape ",
                t.shape_str());
  PAGEDKV_CHECK(t.is_last_dim_contiguous(), name,
                " must be contiguous in its last dimension (strides of other dims are free)");
}

// `b` has `a`'s shape, except (when width >= 0) a last dimension of `width`.
void check_same_rows(const TensorView& a, std::string_view a_name, const TensorView& b,
                     std::string_view b_name, int64_t width) {
  bool same = a.ndim() == b.ndim();
  for (int d = 0; same && d < a.ndim(); ++d)
    same = b.size(d) == (d == a.ndim() - 1 && width >= 0 ? width : a.size(d));
  PAGEDKV_CHECK(same, b_name, " has shape ", b.shape_str(), " but ", a_name, " has shape ",
                a.shape_str(), width >= 0 ? " (the last dimension must be half of it)" : "");
  check_dtype(b, b_name, {a.dtype()});
}

bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data() != b.data() || a.ndim() != b.ndim()) return false;
  for (int d = 0; d < a.ndim(); ++d)
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  return true;
}

// Extent in elements of one index of dim 0 (all later dims), or -1 for a negative stride.
int64_t slab_span(const TensorView& t) {
  int64_t span = 1;
  for (int d = 1; d < t.ndim(); ++d) {
    if (t.stride(d) < 0) return -1;
    span += (t.size(d) - 1) * t.stride(d);
  }
  return span;
}

// True when a and b are provably element-disjoint slices of one row-strided buffer: the same
// dim-0 stride S, each token's elements within S, and b's slab beside a's in every row (q and
// k of a fused qkv projection, whose byte ranges interleave).
bool interleaved_disjoint(const TensorView& a, const TensorView& b) {
  const int64_t es = static_cast<int64_t>(a.element_size());
  const int64_t S = a.stride(0);
  if (a.ndim() != b.ndim() || a.dtype() != b.dtype() || S <= 0 || b.stride(0) != S) return false;
  const int64_t span_a = slab_span(a), span_b = slab_span(b);
  if (span_a < 0 || span_b < 0 || span_a > S || span_b > S) return false;
  const auto bytes = static_cast<int64_t>(reinterpret_cast<uintptr_t>(b.data()) -
                                          reinterpret_cast<uintptr_t>(a.data()));
  if (bytes % es != 0) return false;
  const int64_t r = ((bytes / es) % S + S) % S;  // b's start inside a's row frame
  return r >= span_a && r + span_b <= S;
}

void check_norm_weight(const TensorView& weight, const TensorView& input, float epsilon,
                       float weight_offset) {
  check_dtype(weight, "weight", {input.dtype()});
  check_shape(weight, "weight", {input.size(-1)});
  detail::check_cuda_dense(weight, "weight");
  PAGEDKV_CHECK(std::isfinite(epsilon) && epsilon >= 0.0f,
                "epsilon must be finite and >= 0, got ", epsilon);
  PAGEDKV_CHECK(std::isfinite(weight_offset), "weight_offset must be finite, got ",
                weight_offset);
}

}  // namespace

void rms_norm(const TensorView& out, const TensorView& input, const TensorView& weight,
              float epsilon, float weight_offset, Stream stream) {
  detail::check_devices({{&input, "input"}, {&out, "out"}, {&weight, "weight"}});
  check_layer_rows(input, "input");
  check_layer_rows(out, "out");
  check_same_rows(input, "input", out, "out", -1);
  check_norm_weight(weight, input, epsilon, weight_offset);
  detail::check_no_self_overlap(out, "out");
  detail::check_no_overlap({&out, "out"}, {{&weight, "weight"}});
  // In place is fine (each element is read before it is written, by the same thread), any
  // other overlap of out and input is not.
  if (!same_view(out, input)) detail::check_no_overlap({&out, "out"}, {{&input, "input"}});
  dispatch(
      input, input.numel(), "rms_norm",
      [&] { cpu_ops::rms_norm(out, input, weight, epsilon, weight_offset); },
      [&] {
#ifdef PAGEDKV_WITH_CUDA
        cuda_ops::rms_norm(out, input, weight, epsilon, weight_offset, stream);
#endif
      });
  (void)stream;
}

void fused_add_rms_norm(const TensorView& input, const TensorView& residual,
                        const TensorView& weight, float epsilon, float weight_offset,
                        Stream stream) {
  detail::check_devices({{&input, "input"}, {&residual, "residual"}, {&weight, "weight"}});
  check_layer_rows(input, "input");
  check_layer_rows(residual, "residual");
  check_same_rows(input, "input", residual, "residual", -1);
  check_norm_weight(weight, input, epsilon, weight_offset);
  detail::check_no_self_overlap(input, "input");
  detail::check_no_self_overlap(residual, "residual");
  detail::check_no_overlap({&input, "input"}, {{&residual, "residual"}, {&weight, "weight"}});
  detail::check_no_overlap({&residual, "residual"}, {{&weight, "weight"}});
  dispatch(
      input, input.numel(), "fused_add_rms_norm",
      [&] { cpu_ops::fused_add_rms_norm(input, residual, weight, epsilon, weight_offset); },
      [&] {
#ifdef PAGEDKV_WITH_CUDA
        cuda_ops::fused_add_rms_norm(input, residual, weight, epsilon, weight_offset, stream);
#endif
      });
  (void)stream;
}

void rotary_embedding(const TensorView& positions, const TensorView& query,
                      const std::optional<TensorView>& key, const TensorView& cos_sin_cache,
                      bool is_neox, Stream stream) {
  const TensorView& k = key ? *key : query;
  detail::check_devices({{&query, "query"},
                         {&positions, "positions"},
                         {&k, "key"},
                         {&cos_sin_cache, "cos_sin_cache"}});
  detail::check_float(query, "query");
  detail::check_rows(query, "query", -1, -1, -1);
  const int64_t T = query.size(0), D = query.size(2);
  if (key) {
    detail::check_rows(*key, "key", T, -1, D);
    check_dtype(*key, "key", {query.dtype()});
  }
  check_dtype(positions, "positions", {DType::kInt64, DType::kInt32});
  check_shape(positions, "positions", {T});
  detail::check_cuda_dense(positions, "positions");
  check_dtype(cos_sin_cache, "cos_sin_cache", {DType::kFloat32, query.dtype()});
  check_ndim(cos_sin_cache, "cos_sin_cache", 2);
  check_contiguous(cos_sin_cache, "cos_sin_cache");
  const int64_t rot = cos_sin_cache.size(1), max_pos = cos_sin_cache.size(0);
  PAGEDKV_CHECK(rot >= 2 && rot % 2 == 0 && rot <= D, "cos_sin_cache has ", rot,
                " columns: the rotary dim must be even and in [2, head_size = ", D, "]");
  detail::check_no_self_overlap(query, "query");
  const detail::Named reads[] = {{&positions, "positions"}, {&cos_sin_cache, "cos_sin_cache"}};
  detail::check_no_overlap({&query, "query"}, reads);
  if (key) {
    detail::check_no_self_overlap(*key, "key");
    detail::check_no_overlap({&key.value(), "key"}, reads);
    if (!interleaved_disjoint(query, *key))
      detail::check_no_overlap({&key.value(), "key"}, {{&query, "query"}});
  }
  if (!query.device().is_cuda()) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = detail::host_int(positions, t);
      PAGEDKV_CHECK(p >= 0 && p < max_pos, "positions[", t, "] = ", p,
                    " is outside the cos_sin_cache's [0, ", max_pos, ")");
    }
  }
  dispatch(
      query, T, "rotary_embedding",
      [&] { cpu_ops::rotary_embedding(positions, query, key, cos_sin_cache, is_neox); },
      [&] {
#ifdef PAGEDKV_WITH_CUDA
        cuda_ops::rotary_embedding(positions, query, key, cos_sin_cache, is_neox, stream);
#endif
      });
  (void)stream;
}

void act_and_mul(GatedActivation act, const TensorView& out, const TensorView& input,
                 Stream stream) {
  detail::check_devices({{&input, "input"}, {&out, "out"}});
  check_layer_rows(input, "input");
  check_layer_rows(out, "out");
  PAGEDKV_CHECK(input.size(-1) % 2 == 0, "input's last dimension must be even (gate | up), got ",
                input.shape_str());
  check_same_rows(input, "input", out, "out", input.size(-1) / 2);
  detail::check_no_self_overlap(out, "out");
  detail::check_no_overlap({&out, "out"}, {{&input, "input"}});
  dispatch(
      input, out.numel(), "act_and_mul", [&] { cpu_ops::act_and_mul(act, out, input); },
      [&] {
#ifdef PAGEDKV_WITH_CUDA
        cuda_ops::act_and_mul(act, out, input, stream);
#endif
      });
  (void)stream;
}

}  // namespace pagedkv::ops
