// CPU kernels of the multi-LoRA ops (include/pagedkv/lora.h). The dispatcher (src/ops/lora.cpp)
// validates every argument first, so these assume consistent shapes, dtypes and indices.
#pragma once

#include <vector>

#include "pagedkv/lora.h"

namespace pagedkv::cpu_ops {

void lora_shrink(const TensorView& buf, const TensorView& x, const TensorView& a,
                 const TensorView& token_lora_indices);

void lora_expand(const TensorView& out, const TensorView& buf, const TensorView& b,
                 const TensorView& token_lora_indices, const std::vector<int64_t>& slice_sizes);

}  // namespace pagedkv::cpu_ops
