// CPU implementations of the ops in include/pagedkv/ops.h. The dispatcher (src/ops/ops.cpp)
// validates every argument first (shapes, dtypes, devices, block ids and slots in range) and
// calls these only for CPU tensors, so they can assume consistent inputs.
// Numerics: fp32 accumulation everywhere; inputs are converted to fp32 in small tiles.
#pragma once

#include <vector>

#include "pagedkv/ops.h"

namespace pagedkv::cpu_ops {

// The scale's value: the number, or its host array's element (the dispatcher checked the array is
// a 1-element float32 array on the host).
inline float host_scale(const Scale& s) {
  return s.array ? *s.array->data_as<const float>() : s.value;
}

void reshape_and_cache(const TensorView& key, const TensorView& value, const TensorView& key_cache,
                       const TensorView& value_cache, const TensorView& slot_mapping,
                       KVCacheDType kv_cache_dtype, float k_scale, float v_scale);

void reshape_and_cache_flash(const TensorView& key, const TensorView& value,
                             const TensorView& key_cache, const TensorView& value_cache,
                             const TensorView& slot_mapping, KVCacheDType kv_cache_dtype,
                             float k_scale, float v_scale);

void paged_attention_v1(const TensorView& out, const TensorView& query, const TensorView& key_cache,
                        const TensorView& value_cache, int num_kv_heads,
                        const TensorView& block_tables, const TensorView& seq_lens, int max_seq_len,
                        const AttentionOptions& opts);

void paged_attention_v2(const TensorView& out, const TensorView& exp_sums,
                        const TensorView& max_logits, const TensorView& tmp_out,
                        const TensorView& query, const TensorView& key_cache,
                        const TensorView& value_cache, int num_kv_heads,
                        const TensorView& block_tables, const TensorView& seq_lens, int max_seq_len,
                        const AttentionOptions& opts, int partition_size);

// Work-balanced decode over a validated host plan (ops::paged_attention_balanced).
void paged_attention_balanced(const TensorView& out, const TensorView& exp_sums,
                              const TensorView& max_logits, const TensorView& tmp_out,
                              const TensorView& query, const TensorView& key_cache,
                              const TensorView& value_cache, int num_kv_heads,
                              const TensorView& block_tables, const TensorView& seq_lens,
                              const TensorView& work_items, const TensorView& seq_offsets,
                              const AttentionOptions& opts, const std::optional<TensorView>& lse);

// merge_attn_states (ops.h) on host arrays.
void merge_attn_states(const TensorView& output, const std::optional<TensorView>& output_lse,
                       const TensorView& prefix_output, const TensorView& prefix_lse,
                       const TensorView& suffix_output, const TensorView& suffix_lse);

void context_attention_fwd(const TensorView& out, const TensorView& query, const TensorView& key,
                           const TensorView& value, const TensorView& key_cache,
                           const TensorView& value_cache, const TensorView& block_tables,
                           const TensorView& query_start_loc, const TensorView& seq_lens,
                           int max_query_len, const AttentionOptions& opts);

void copy_blocks(const std::vector<TensorView>& key_caches,
                 const std::vector<TensorView>& value_caches, const TensorView& block_mapping);

// Both src and dst in host memory (CPU or pinned).
void swap_blocks(const TensorView& src, const TensorView& dst, const TensorView& block_mapping);

}  // namespace pagedkv::cpu_ops
