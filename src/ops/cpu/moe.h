// CPU kernels of the MoE ops (include/pagedkv/moe.h). The dispatcher (src/ops/moe.cpp) validates
// every argument first, so these assume consistent shapes, dtypes and expert ids.
#pragma once

#include <optional>

#include "pagedkv/moe.h"

namespace pagedkv::cpu_ops {

void topk_softmax(const TensorView& topk_weights, const TensorView& topk_ids,
                  const TensorView& gating_output, bool renormalize);

void moe_align_block_size(const TensorView& topk_ids, int num_experts, int block_size,
                          const TensorView& sorted_token_ids, const TensorView& expert_ids,
                          const TensorView& num_tokens_post_pad);

void moe_grouped_gemm(const TensorView& out, const TensorView& a, const TensorView& w,
                      const TensorView& sorted_token_ids, const TensorView& expert_ids,
                      const TensorView& num_tokens_post_pad, int top_k, int block_size,
                      const std::optional<TensorView>& topk_weights);

}  // namespace pagedkv::cpu_ops
