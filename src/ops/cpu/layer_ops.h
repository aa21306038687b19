// CPU versions of the fused layer ops (include/pagedkv/layer_ops.h). The dispatcher
// (src/ops/layer_ops.cpp) validates every argument first and calls these for host arrays only.
#pragma once

#include <optional>

#include "ops/cpu/half.h"
#include "pagedkv/layer_ops.h"

namespace pagedkv::cpu_ops {

void rms_norm(const TensorView& out, const TensorView& input, const TensorView& weight,
              float epsilon, float weight_offset);

void fused_add_rms_norm(const TensorView& input, const TensorView& residual,
                        const TensorView& weight, float epsilon, float weight_offset);

void rotary_embedding(const TensorView& positions, const TensorView& query,
                      const std::optional<TensorView>& key, const TensorView& cos_sin_cache,
                      bool is_neox);

void act_and_mul(ops::GatedActivation act, const TensorView& out, const TensorView& input);

// x rounded to `dtype` and back: the layer ops round where the eager reference does.
inline float round_to(DType dtype, float x) {
  if (dtype == DType::kFloat16) return half_to_float(float_to_half(x));
  if (dtype == DType::kBFloat16) return bf16_to_float(float_to_bf16(x));
  return x;
}

}  // namespace pagedkv::cpu_ops
