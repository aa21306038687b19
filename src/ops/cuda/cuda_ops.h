// CUDA implementations of the ops in include/pagedkv/ops.h. The dispatcher (src/ops/ops.cpp)
// validates every argument first and calls these only for CUDA tensors, so they can assume
// consistent shapes, dtypes and devices. Each enqueues its work on `stream` without host
// synchronisation or allocation (CUDA-graph safe).
#pragma once

#include <string_view>
#include <vector>

#include "pagedkv/ops.h"

namespace pagedkv::cuda_ops {

void reshape_and_cache(const TensorView& key, const TensorView& value, const TensorView& key_cache,
                       const TensorView& value_cache, const TensorView& slot_mapping,
                       KVCacheDType kv_cache_dtype, const Scale& k_scale, const Scale& v_scale,
                       Stream stream);

void reshape_and_cache_flash(const TensorView& key, const TensorView& value,
                             const TensorView& key_cache, const TensorView& value_cache,
                             const TensorView& slot_mapping, KVCacheDType kv_cache_dtype,
                             const Scale& k_scale, const Scale& v_scale, Stream stream);

void paged_attention_v1(const TensorView& out, const TensorView& query, const TensorView& key_cache,
                        const TensorView& value_cache, int num_kv_heads,
                        const TensorView& block_tables, const TensorView& seq_lens, int max_seq_len,
                        const AttentionOptions& opts, Stream stream);

void paged_attention_v2(const TensorView& out, const TensorView& exp_sums,
                        const TensorView& max_logits, const TensorView& tmp_out,
                        const TensorView& query, const TensorView& key_cache,
                        const TensorView& value_cache, int num_kv_heads,
                        const TensorView& block_tables, const TensorView& seq_lens, int max_seq_len,
                        const AttentionOptions& opts, int partition_size, Stream stream);

// Work-balanced decode (ops::paged_attention_balanced) on the Hopper decode.
void paged_attention_balanced(const TensorView& out, const TensorView& exp_sums,
                              const TensorView& max_logits, const TensorView& tmp_out,
                              const TensorView& query, const TensorView& key_cache,
                              const TensorView& value_cache, int num_kv_heads,
                              const TensorView& block_tables, const TensorView& seq_lens,
                              const TensorView& work_items, const TensorView& seq_offsets,
                              const AttentionOptions& opts, const std::optional<TensorView>& lse,
                              Stream stream);

// merge_attn_states (ops.h) on GPU arrays.
void merge_attn_states(const TensorView& output, const std::optional<TensorView>& output_lse,
                       const TensorView& prefix_output, const TensorView& prefix_lse,
                       const TensorView& suffix_output, const TensorView& suffix_lse,
                       Stream stream);

// ops::balanced_decode_target on a GPU.
int balanced_decode_target(const TensorView& query, const TensorView& key_cache,
                           const TensorView& value_cache, int num_kv_heads,
                           KVCacheDType kv_cache_dtype, AttentionKernel kernel);

// The kernel the decode runs under the choice `kernel` (ValueError when a named one does not
// cover the call).
AttentionKernel decode_kernel(const TensorView& query, const TensorView& key_cache,
                              const TensorView& value_cache, int num_kv_heads,
                              KVCacheDType kv_cache_dtype, AttentionKernel kernel);

void context_attention_fwd(const TensorView& out, const TensorView& query, const TensorView& key,
                           const TensorView& value, const TensorView& key_cache,
                           const TensorView& value_cache, const TensorView& block_tables,
                           const TensorView& query_start_loc, const TensorView& seq_lens,
                           int max_query_len, const AttentionOptions& opts, Stream stream);

void copy_blocks(const std::vector<TensorView>& key_caches,
                 const std::vector<TensorView>& value_caches, const TensorView& block_mapping,
                 Stream stream);

void swap_blocks(const TensorView& src, const TensorView& dst, const TensorView& block_mapping,
                 Stream stream);

// False in builds without the decode timeline (decode_timeline.h).
bool set_decode_timeline_file(std::string_view path);

}  // namespace pagedkv::cuda_ops
