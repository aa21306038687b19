// Gated activations on the CPU: out[..., d] = act(x[..., :d]) * x[..., d:], row by row.
#include <cmath>
#include <vector>

#include "ops/cpu/layer_ops.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/vec.h"
#include "ops/layer_rows.h"

namespace pagedkv::cpu_ops {
namespace {

float activate(ops::GatedActivation act, float x) {
  switch (act) {
    case ops::GatedActivation::kSilu: return x / (1.0f + std::exp(-x));
    case ops::GatedActivation::kGelu: return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
    case ops::GatedActivation::kGeluTanh: {
      const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
      return 0.5f * x * (1.0f + std::tanh(inner));
    }
  }
  return x;
}

}  // namespace

void act_and_mul(ops::GatedActivation act, const TensorView& out, const TensorView& input) {
  const ops::RowGeometry in = ops::row_geometry(input), o = ops::row_geometry(out);
  const int d = static_cast<int>(o.width);
  const DType dtype = input.dtype();
  const size_t es = input.element_size();
  const char* src = static_cast<const char*>(input.data());
  char* dst = static_cast<char*>(out.data());
  parallel_for(
      in.rows,
      [&](int64_t r) {
        thread_local std::vector<float> buf;
        if (buf.size() < static_cast<size_t>(2 * d)) buf.resize(2 * d);
        float* x = buf.data();
        load_row(src + in.offset(r) * es, dtype, x, 2 * d);
        for (int i = 0; i < d; ++i) x[i] = round_to(dtype, activate(act, x[i])) * x[d + i];
        store_row(x, dtype, dst + o.offset(r) * es, d);
      },
      in.rows * d * 16);
}

}  // namespace pagedkv::cpu_ops
