// Mixture-of-experts ops (vLLM's fused_moe pipeline): route each token to its top-k experts,
// sort the (token, slot) pairs by expert into block-aligned groups, and run one grouped GEMM per
// projection over all experts at once (one launch, no loop over experts on the host).
//
//   topk_softmax          router logits [T, E] -> top-k weights [T, k] and expert ids [T, k]
//   moe_align_block_size  expert ids [T, k] -> sorted_token_ids (flat pair index t*k + j, grouped
//                         by expert, each group padded to a multiple of block_size with the
//                         value T*k), expert_ids (one per block), num_tokens_post_pad
//   moe_grouped_gemm      out[i] = a[i / a_div] . w[expert of i]^T (* topk_weights[i])
//
// Validation follows include/pagedkv/ops.h: ValueError / TypeError naming the argument; checks
// of array *values* (expert ids in range, a consistent sort) run for host arrays only.
#pragma once

#include <cstdint>
#include <optional>

#include "pagedkv/tensor.h"

namespace pagedkv::ops {

// Softmax over the experts of each token, then its top-k (ties: the lower expert id first).
//   gating_output [T, E] float32 / float16 / bfloat16
//   topk_weights  [T, k] float32 (written): the k largest probabilities, largest first; with
//                 `renormalize` divided by their sum (= a softmax over the top-k logits: Mixtral,
//                 Qwen3-MoE with norm_topk_prob)
//   topk_ids      [T, k] int32 (written)
void topk_softmax(const TensorView& topk_weights, const TensorView& topk_ids,
                  const TensorView& gating_output, bool renormalize, Stream stream = nullptr);

// Length that sorted_token_ids needs for `num_pairs` = T * k pairs over `num_experts` experts
// (the worst case: every expert's group padded by block_size - 1).
int64_t moe_max_padded_tokens(int64_t num_pairs, int64_t num_experts, int64_t block_size);

// Sorts the (token, slot) pairs of topk_ids [T, k] int32 by expert, in pair order within an
// expert, each expert's group padded to a multiple of block_size.
//   sorted_token_ids    [>= moe_max_padded_tokens] int32 (written): pair index t*k + j, or T*k
//                       for padding (also fills everything past num_tokens_post_pad)
//   expert_ids          [>= len(sorted_token_ids) / block_size] int32 (written): the expert of
//                       each block of block_size rows (-1 for blocks past num_tokens_post_pad)
//   num_tokens_post_pad [1] int32 (written): the used length of sorted_token_ids
void moe_align_block_size(const TensorView& topk_ids, int num_experts, int block_size,
                          const TensorView& sorted_token_ids, const TensorView& expert_ids,
                          const TensorView& num_tokens_post_pad, Stream stream = nullptr);

// The grouped GEMM over the blocks moe_align_block_size made: for every row r below
// num_tokens_post_pad whose pair index i = sorted_token_ids[r] < out.size(0),
//   out[i, :] = a[i / top_k, :] . w[expert_ids[r / block_size]]^T  (* topk_weights[i] if given)
// accumulated in fp32. A block whose expert id is negative (an expert this rank does not hold)
// writes zeros. Pass top_k = k for the first projection (a = the tokens [T, K]) and top_k = 1
// for the second (a = the per-pair activations [T*k, K]).
//   out [T*k, N], a [M, K] (float32 / float16 / bfloat16, one dtype), w [E, N, K] (a's dtype,
//   contiguous), topk_weights [T*k] or [T, k] float32 (contiguous on CUDA)
// block_size: as given to moe_align_block_size; the CUDA kernel takes 16, 32 or 64.
void moe_grouped_gemm(const TensorView& out, const TensorView& a, const TensorView& w,
                      const TensorView& sorted_token_ids, const TensorView& expert_ids,
                      const TensorView& num_tokens_post_pad, int top_k, int block_size,
                      const std::optional<TensorView>& topk_weights, Stream stream = nullptr);

}  // namespace pagedkv::ops
