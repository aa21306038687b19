// The argument checks the decode ops share (ops.cpp: paged_attention_v1 / v2 and the kernel
// choice; decode_balanced.cpp: paged_attention_balanced).
#pragma once

#include "ops/validate.h"
#include "pagedkv/ops.h"

namespace pagedkv::ops {

// The query and the caches of a decode call (what the kernel choice depends on); returns the
// cache geometry.
detail::CacheGeometry check_decode_query(const TensorView& query, const TensorView& key_cache,
                                         const TensorView& value_cache, int num_kv_heads,
                                         KVCacheDType kv_dtype);

// Everything but the split's workspace: out, block tables, seq_lens (values too, for host
// arrays), options; returns the cache geometry.
detail::CacheGeometry check_decode(const TensorView& out, const TensorView& query,
                                   const TensorView& key_cache, const TensorView& value_cache,
                                   int num_kv_heads, const TensorView& block_tables,
                                   const TensorView& seq_lens, int max_seq_len,
                                   const AttentionOptions& opts);

}  // namespace pagedkv::ops
