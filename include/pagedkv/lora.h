// Multi-LoRA ops (punica's BGMV idea): the low-rank deltas of every adapter of a step applied in
// one launch per op, each token choosing its adapter by an index into stacked adapter weights.
//
//   lora_shrink   buf[t, :] = x[t, :] . a[idx[t]]^T                     (x [T, K] -> buf [T, R])
//   lora_expand   out[t, n] += buf[t, s(n)*r : s(n)*r + r] . b[idx[t], n, :]
//
// R = slices * r: a layer whose output is several projections side by side (q/k/v, gate/up)
// stacks the A matrices of its slices into one [R, K] (one shrink), and b [L, N, r] holds each
// output column's row of its slice's B; slice_sizes (summing to N) says which columns belong to
// which slice s(n). The LoRA scaling (alpha / r) is folded into b by the caller. A token whose
// index is negative has no adapter: shrink writes zeros and expand leaves its row as it is.
//
// Validation follows include/pagedkv/ops.h: ValueError / TypeError naming the argument; the
// index values are checked against L for host arrays only (a CUDA launch never syncs).
#pragma once

#include <cstdint>
#include <vector>

#include "pagedkv/tensor.h"

namespace pagedkv::ops {

// Which CUDA kernels run the ops (the CPU kernels are the same for both). kPerToken: one token
// per CTA, element-wise loads (the measured default). kTiled: 16-byte packed loads where rows
// are aligned, and up to 32 tokens per expand CTA, so an adapter's B rows of the CTA's columns
// come from L2 once per tile of tokens instead of once per token (not yet measured on a GPU).
enum class LoRAVariant : int { kPerToken = 0, kTiled = 1 };

// buf [T, R] float32 (written), x [T, K] (float32 / float16 / bfloat16, contiguous last dim),
// a [L, R, K] (x's dtype, contiguous), token_lora_indices [T] int32 in [-1, L).
void lora_shrink(const TensorView& buf, const TensorView& x, const TensorView& a,
                 const TensorView& token_lora_indices, Stream stream = nullptr,
                 LoRAVariant variant = LoRAVariant::kPerToken);

// out [T, N] (float32 / float16 / bfloat16, contiguous last dim; updated in place), buf [T, R]
// float32, b [L, N, r] (out's dtype, contiguous), token_lora_indices [T] int32 in [-1, L),
// slice_sizes: 1 to 8 positive column counts summing to N, with R = len(slice_sizes) * r.
void lora_expand(const TensorView& out, const TensorView& buf, const TensorView& b,
                 const TensorView& token_lora_indices, const std::vector<int64_t>& slice_sizes,
                 Stream stream = nullptr, LoRAVariant variant = LoRAVariant::kPerToken);

}  // namespace pagedkv::ops
