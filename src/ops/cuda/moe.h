// CUDA kernels of the MoE ops (include/pagedkv/moe.h). The dispatcher (src/ops/moe.cpp)
// validates every argument first. Each op enqueues its work on `stream` without host
// synchronisation or allocation (CUDA-graph safe): the grouped GEMM reads num_tokens_post_pad on
// the device and launches a grid for the worst case, whose surplus CTAs return at once.
#pragma once

#include <optional>

#include "pagedkv/moe.h"

namespace pagedkv::cuda_ops {

void topk_softmax(const TensorView& topk_weights, const TensorView& topk_ids,
                  const TensorView& gating_output, bool renormalize, Stream stream);

void moe_align_block_size(const TensorView& topk_ids, int num_experts, int block_size,
                          const TensorView& sorted_token_ids, const TensorView& expert_ids,
                          const TensorView& num_tokens_post_pad, Stream stream);

void moe_grouped_gemm(const TensorView& out, const TensorView& a, const TensorView& w,
                      const TensorView& sorted_token_ids, const TensorView& expert_ids,
                      const TensorView& num_tokens_post_pad, int top_k, int block_size,
                      const std::optional<TensorView>& topk_weights, Stream stream);

}  // namespace pagedkv::cuda_ops
