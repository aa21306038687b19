// Fused layer ops of a transformer block (vLLM's names): RMSNorm, residual add + RMSNorm, rotary
// position embedding, gated activations. Same contract as the attention ops (ops.h): DLPack
// arrays as TensorViews, every argument validated (ValueError / TypeError naming it), CPU or
// CUDA by the arrays' device, CUDA work on `stream` without synchronisation or allocation
// (CUDA-graph safe).
//
// Rows: `input`, `out`, `residual`, `query`, `key` are arrays of rank 1 to 3 whose last
// dimension is contiguous; the leading dimensions may have any strides (a view of a fused qkv
// projection is fine). dtypes float32 / float16 / bfloat16, one per call.
//
// Rounding follows the eager HF formulas in the array's dtype (each product or sum the reference
// computes in fp16 / bf16 is rounded there too), so swapping the eager math for a fused op does
// not move a greedy decode; everything else accumulates in fp32.
#pragma once

#include <cstdint>
#include <optional>

#include "pagedkv/tensor.h"

namespace pagedkv::ops {

// out = x / sqrt(mean(x^2) + epsilon) * (weight_offset + weight), row by row.
//   input, out: [..., hidden]; weight: [hidden] of the input's dtype.
// weight_offset == 0 (Llama, Qwen): the normalised row is rounded to the dtype before the weight
// multiply (HF's `weight * x.to(dtype)`); weight_offset != 0 (Gemma's 1 + w): the whole product
// is taken in fp32 and rounded once (HF Gemma's `(x * (1 + w.float())).type_as(x)`).
// `out` may be `input` itself (the same view: per-head q/k norms in place), but must not
// partially overlap it.
void rms_norm(const TensorView& out, const TensorView& input, const TensorView& weight,
              float epsilon, float weight_offset = 0.0f, Stream stream = nullptr);

// In place, as vLLM's fused_add_rms_norm: residual = input + residual (rounded to the dtype),
// then input = rms_norm(residual). input, residual: [..., hidden] of one shape and dtype.
void fused_add_rms_norm(const TensorView& input, const TensorView& residual,
                        const TensorView& weight, float epsilon, float weight_offset = 0.0f,
                        Stream stream = nullptr);

// Rotates query [T, Hq, head_size] and key [T, Hk, head_size] (optional) in place by the angles
// of each token's position: cos_sin_cache [max_position, rotary_dim] holds cos in its first
// rotary_dim / 2 columns and sin in the rest (any scaling is baked into the table; float32 or
// the query's dtype). Only the first rotary_dim dims of each head rotate (partial rotary).
// is_neox: pairs (i, i + rotary_dim / 2) (NeoX / rotate-half); else (2i, 2i + 1) (GPT-J).
// positions: [T] int32 / int64. On the host a position outside [0, max_position) is a
// ValueError; on CUDA (no host read) such a token is left unrotated.
void rotary_embedding(const TensorView& positions, const TensorView& query,
                      const std::optional<TensorView>& key, const TensorView& cos_sin_cache,
                      bool is_neox, Stream stream = nullptr);

// Gated activations of a fused gate/up projection: out[..., d] = act(x[..., :d]) * x[..., d:]
// for input [..., 2d]. kGelu is the exact (erf) GELU, kGeluTanh its tanh approximation.
// act(gate) is rounded to the dtype before the multiply (HF's `act(gate) * up`).
enum class GatedActivation : uint8_t { kSilu, kGelu, kGeluTanh };

void act_and_mul(GatedActivation act, const TensorView& out, const TensorView& input,
                 Stream stream = nullptr);

}  // namespace pagedkv::ops
