// Host helpers of the CUDA-core attention kernel (attention_setup.cu).
#pragma once

#include "ops/cuda/attention_params.h"

namespace pagedkv::cuda_ops {

// The fields that depend on the query and the caches alone (what a kernel's coverage depends
// on): no output, block tables or sequence lengths.
AttnParams make_attn_shape(const TensorView& query, const TensorView& key_cache,
                           const TensorView& value_cache, int num_kv_heads,
                           const AttentionOptions& opts);

// Fields common to decode and prefill: queries/outputs, cache, block tables, options.
AttnParams make_attn_params(const TensorView& out, const TensorView& query,
                            const TensorView& key_cache, const TensorView& value_cache,
                            int num_kv_heads, const TensorView& block_tables,
                            const TensorView& seq_lens, const AttentionOptions& opts);

// Launches on `s` for the query dtype; `op` names the caller in errors.
void launch_attention(const AttnParams& p, DType qdtype, KVCacheDType cache, cudaStream_t s,
                      const char* op);

}  // namespace pagedkv::cuda_ops
