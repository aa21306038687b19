// Host side shared by decode and the prefill fallback: fills AttnParams from the op's arguments
// and dispatches on the query dtype.
#include <algorithm>

#include "ops/cuda/attention_setup.h"

namespace pagedkv::cuda_ops {

AttnParams make_attn_shape(const TensorView& query, const TensorView& key_cache,
                           const TensorView& value_cache, int num_kv_heads,
                           const AttentionOptions& opts) {
  const bool vllm = key_cache.ndim() == 5;
  AttnParams p{};
  p.q = query.data();
  p.q_s_tok = query.stride(0);
  p.q_s_head = query.stride(1);
  p.k_cache = key_cache.data();
  p.v_cache = value_cache.data();
  p.kl = make_layout(key_cache, vllm, false);
  p.vl = make_layout(value_cache, vllm, true);
  p.num_blocks = static_cast<int>(key_cache.size(0));
  p.num_q = static_cast<int>(query.size(0));
  p.num_heads = static_cast<int>(query.size(1));
  p.num_kv_heads = num_kv_heads;
  p.group = p.num_heads / num_kv_heads;
  p.head_size = static_cast<int>(query.size(2));
  p.block_size = static_cast<int>(vllm ? key_cache.size(3) : key_cache.size(1));
  p.bs_shift = is_pow2(p.block_size) ? log2_int(p.block_size) : -1;
  const int cache_fp8 = fp8_kind(opts.kv_cache_dtype);
  p.n_gchunks = ceil_div(p.group, heads_per_cta(p.group));
  p.qk_scale = opts.scale;
  p.k_scale = device_scale(opts.k_scale, cache_fp8 != kNoFp8);
  p.v_scale = device_scale(opts.v_scale, cache_fp8 != kNoFp8);
  p.softcap = opts.logits_soft_cap > 0.f ? opts.logits_soft_cap : 0.f;
  p.alibi = opts.alibi_slopes ? opts.alibi_slopes->data_as<const float>() : nullptr;
  p.window = opts.sliding_window > 0 ? opts.sliding_window : 0;
  p.causal = opts.causal;
  const int run_bytes = std::min<int>(16, 8 * static_cast<int>(key_cache.element_size()));
  p.kv_vec = vector_ok(key_cache, run_bytes) && vector_ok(value_cache, run_bytes);
  return p;
}

AttnParams make_attn_params(const TensorView& out, const TensorView& query,
                            const TensorView& key_cache, const TensorView& value_cache,
                            int num_kv_heads, const TensorView& block_tables,
                            const TensorView& seq_lens, const AttentionOptions& opts) {
  AttnParams p = make_attn_shape(query, key_cache, value_cache, num_kv_heads, opts);
  p.out = out.data();
  p.o_s_tok = out.stride(0);
  p.o_s_head = out.stride(1);
  p.block_tables = block_tables.data_as<const int>();
  p.bt_stride = block_tables.stride(0);
  p.max_blocks = static_cast<int>(std::max<int64_t>(1, block_tables.size(1)));
  p.seq_lens = seq_lens.data_as<const int>();
  p.num_seqs = static_cast<int>(seq_lens.size(0));
  return p;
}

void launch_attention(const AttnParams& p, DType qdtype, KVCacheDType cache, cudaStream_t s,
                      const char* op) {
  if (p.num_q == 0) return;
  const int fp8 = fp8_kind(cache);
  switch (qdtype) {
    case DType::kFloat32: launch_attention_f32(p, fp8, s); break;
    case DType::kFloat16: launch_attention_f16(p, fp8, s); break;
    case DType::kBFloat16: launch_attention_bf16(p, fp8, s); break;
    default: throw TypeError(std::string(op) + ": query dtype must be float32/float16/bfloat16");
  }
  check_launch(op);
}

}  // namespace pagedkv::cuda_ops
