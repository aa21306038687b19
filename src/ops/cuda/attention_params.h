// Parameters of the CUDA-core paged attention kernel (attention_kernel.cuh), shared by decode
// (one query per sequence, keys from the cache) and the prefill fallback (one query per token,
// keys of the cached context from the cache, keys of the new tokens from `k_new`/`v_new`).
#pragma once

#include <cstdint>

#include "ops/cuda/cache_layout.cuh"

namespace pagedkv::cuda_ops {

struct AttnParams {
  const void* q;  // [num_q, num_heads, head_size]
  int64_t q_s_tok, q_s_head;
  void* out;  // [num_q, num_heads, head_size]
  int64_t o_s_tok, o_s_head;

  const void* k_cache;  // either layout (cache_layout.cuh)
  const void* v_cache;
  CacheLayout kl, vl;
  const int* block_tables;  // [num_seqs, max_blocks_per_seq] int32
  int64_t bt_stride;
  int max_blocks, num_blocks;  // block table columns; cache blocks (ids are clamped to these)
  const int* seq_lens;         // [num_seqs] int32

  // Prefill mode when query_start_loc != nullptr: query i is token i of the flat batch.
  const int* query_start_loc;  // [num_seqs + 1] int32
  const void* k_new;           // [num_q, num_kv_heads, head_size]
  const void* v_new;
  CacheLayout knl, vnl;  // the new keys/values addressed as (token, 0, head, d)

  int num_seqs, num_q, num_heads, num_kv_heads, group, head_size;
  int block_size, bs_shift;      // bs_shift >= 0 when block_size is a power of two
  int n_gchunks;                 // CTAs per KV head (query heads of a group split over them)
  float qk_scale;                // softmax scale
  float softcap;                 // > 0: cap * tanh(logit / cap)
  DeviceScale k_scale, v_scale;  // fp8 cache dequantisation (1 otherwise); new tokens unscaled
  const float* alibi;            // [num_heads] float32 or nullptr
  int window;                    // > 0: keys with q_pos - key_pos < window
  bool causal;                   // false (prefill of encoders): a query sees its whole sequence
  bool kv_vec;                   // cache runs can be read with 16-byte loads
  bool new_vec;                  // k_new / v_new rows can be read with 16-byte loads

  // Split mode (paged_attention_v2) when partition_size > 0: CTA z handles keys
  // [z * partition_size, (z + 1) * partition_size) and writes partial results.
  int partition_size, max_parts;
  float* exp_sums;    // [num_seqs, num_heads, max_parts]
  float* max_logits;  // [num_seqs, num_heads, max_parts]
  void* tmp_out;      // [num_seqs, num_heads, max_parts, head_size]
  bool tmp_f32;       // tmp_out is float32 (else the query dtype)

  // Balanced mode (paged_attention_balanced, Hopper decode only) when work_items != nullptr: the
  // CTA row r runs work item r of the plan (pagedkv/decode_plan.h) and writes its partial to
  // workspace row r (split mode with max_parts = 1: the store's "sequence" is the item); the
  // reduction merges sequence s's rows seq_offsets[s] .. seq_offsets[s + 1] - 1.
  const int* work_items;   // [plan_items, 3]: (seq, key_lo, key_hi)
  const int* seq_offsets;  // [num_seqs + 1]
  int plan_items;          // the plan's capacity: the grid's rows
  float* lse;              // optional: [num_heads, num_seqs] log-sum-exp of each merged row
};

// Launches the kernel for the query dtype (attention_{f32,f16,bf16}.cu); cache_fp8 is Fp8Kind.
void launch_attention_f32(const AttnParams& p, int cache_fp8, cudaStream_t s);
void launch_attention_f16(const AttnParams& p, int cache_fp8, cudaStream_t s);
void launch_attention_bf16(const AttnParams& p, int cache_fp8, cudaStream_t s);

// Query heads one CTA serves: 1 (MHA), 4 (groups of 2..4) or 8 (larger groups, split over
// ceil(group / 8) CTAs). Fewer instantiations than one per group size; masked heads cost only
// arithmetic, the KV bytes are read once per CTA either way.
inline int heads_per_cta(int group) { return group <= 1 ? 1 : group <= 4 ? 4 : 8; }

}  // namespace pagedkv::cuda_ops
