// CUDA versions of the fused layer ops (include/pagedkv/layer_ops.h). The dispatcher
// (src/ops/layer_ops.cpp) validates every argument first and calls these for CUDA arrays only;
// each enqueues its kernel on `stream` (no synchronisation, no allocation: CUDA-graph safe).
#pragma once

#include <optional>

#include "pagedkv/layer_ops.h"

namespace pagedkv::cuda_ops {

void rms_norm(const TensorView& out, const TensorView& input, const TensorView& weight,
              float epsilon, float weight_offset, Stream stream);

void fused_add_rms_norm(const TensorView& input, const TensorView& residual,
                        const TensorView& weight, float epsilon, float weight_offset,
                        Stream stream);

void rotary_embedding(const TensorView& positions, const TensorView& query,
                      const std::optional<TensorView>& key, const TensorView& cos_sin_cache,
                      bool is_neox, Stream stream);

void act_and_mul(ops::GatedActivation act, const TensorView& out, const TensorView& input,
                 Stream stream);

}  // namespace pagedkv::cuda_ops
