// CUDA kernels of the multi-LoRA ops (include/pagedkv/lora.h). The dispatcher (src/ops/lora.cpp)
// validates every argument first. Each op reads the token indices on the device (no host
// synchronisation, CUDA-graph safe).
#pragma once

#include <vector>

#include "pagedkv/lora.h"

namespace pagedkv::cuda_ops {

void lora_shrink(const TensorView& buf, const TensorView& x, const TensorView& a,
                 const TensorView& token_lora_indices, Stream stream, ops::LoRAVariant variant);

void lora_expand(const TensorView& out, const TensorView& buf, const TensorView& b,
                 const TensorView& token_lora_indices, const std::vector<int64_t>& slice_sizes,
                 Stream stream, ops::LoRAVariant variant);

}  // namespace pagedkv::cuda_ops
