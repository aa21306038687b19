// RMSNorm and residual-add + RMSNorm on the CPU: each row is loaded to fp32, normalised and
// stored back, rows spread over the thread pool.
#include <cmath>
#include <vector>

#include "ops/cpu/layer_ops.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/vec.h"
#include "ops/layer_rows.h"

namespace pagedkv::cpu_ops {
namespace {

struct NormArgs {
  DType dtype;
  int width;
  float epsilon, weight_offset;
  const float* weight;  // fp32 copy of the weight
};

// Normalises the fp32 row x in place (see ops::rms_norm for the rounding of the two forms).
void normalise(float* x, const NormArgs& a) {
  const float mean_sq = dot(x, x, a.width) / static_cast<float>(a.width);
  const float inv = 1.0f / std::sqrt(mean_sq + a.epsilon);
  if (a.weight_offset != 0.0f) {
    for (int i = 0; i < a.width; ++i) x[i] = x[i] * inv * (a.weight_offset + a.weight[i]);
  } else {
    for (int i = 0; i < a.width; ++i) x[i] = round_to(a.dtype, x[i] * inv) * a.weight[i];
  }
}

std::vector<float> weight_f32(const TensorView& weight) {
  std::vector<float> w(static_cast<size_t>(weight.size(0)));
  const char* base = static_cast<const char*>(weight.data());
  const int64_t step = weight.stride(0) * static_cast<int64_t>(weight.element_size());
  for (size_t i = 0; i < w.size(); ++i) load_row(base + int64_t(i) * step, weight.dtype(), &w[i], 1);
  return w;
}

// fn(r, row) for each row r of `g`, with a per-thread fp32 row buffer.
template <typename Fn>
void for_rows(const ops::RowGeometry& g, Fn&& fn) {
  parallel_for(
      g.rows,
      [&](int64_t r) {
        thread_local std::vector<float> buf;
        if (buf.size() < static_cast<size_t>(g.width)) buf.resize(g.width);
        fn(r, buf.data());
      },
      g.rows * g.width * 4);
}

}  // namespace

void rms_norm(const TensorView& out, const TensorView& input, const TensorView& weight,
              float epsilon, float weight_offset) {
  const ops::RowGeometry in = ops::row_geometry(input), o = ops::row_geometry(out);
  const std::vector<float> w = weight_f32(weight);
  const NormArgs a{input.dtype(), static_cast<int>(in.width), epsilon, weight_offset, w.data()};
  const size_t es = input.element_size();
  const char* src = static_cast<const char*>(input.data());
  char* dst = static_cast<char*>(out.data());
  for_rows(in, [&](int64_t r, float* x) {
    load_row(src + in.offset(r) * es, a.dtype, x, a.width);
    normalise(x, a);
    store_row(x, a.dtype, dst + o.offset(r) * es, a.width);
  });
}

void fused_add_rms_norm(const TensorView& input, const TensorView& residual,
                        const TensorView& weight, float epsilon, float weight_offset) {
  const ops::RowGeometry in = ops::row_geometry(input), res = ops::row_geometry(residual);
  const std::vector<float> w = weight_f32(weight);
  const NormArgs a{input.dtype(), static_cast<int>(in.width), epsilon, weight_offset, w.data()};
  const size_t es = input.element_size();
  char* x_base = static_cast<char*>(input.data());
  char* r_base = static_cast<char*>(residual.data());
  for_rows(in, [&](int64_t r, float* x) {
    thread_local std::vector<float> res_row;
    if (res_row.size() < static_cast<size_t>(a.width)) res_row.resize(a.width);
    char* xp = x_base + in.offset(r) * es;
    char* rp = r_base + res.offset(r) * es;
    load_row(xp, a.dtype, x, a.width);
    load_row(rp, a.dtype, res_row.data(), a.width);
    for (int i = 0; i < a.width; ++i) x[i] = round_to(a.dtype, x[i] + res_row[i]);
    store_row(x, a.dtype, rp, a.width);
    normalise(x, a);
    store_row(x, a.dtype, xp, a.width);
  });
}

}  // namespace pagedkv::cpu_ops
