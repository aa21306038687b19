// context_attention_fwd: prefill / extend attention over a paged prefix (chunked prefill, prefix
// reuse). Query token t of sequence s sits at position ctx_len(s) + (t - query_start_loc[s]) and
// attends causally to the cached context (from the paged cache) and to the new tokens up to
// itself (from key/value). fp16/bf16 with an unquantised cache run on Hopper on the wgmma kernel
// (prefill_wgmma_kernel.cuh) where it applies, else on the mma.sync tensor-core kernel
// (prefill_mma_kernel.cuh); other cases use the CUDA-core kernel with one query token per CTA.
#include "ops/cuda/attention_setup.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/prefill_mma.h"
#include "ops/cuda/prefill_order.cuh"
#include "ops/cuda/prefill_wgmma.h"

namespace pagedkv::cuda_ops {

void context_attention_fwd(const TensorView& out, const TensorView& query, const TensorView& key,
                           const TensorView& value, const TensorView& key_cache,
                           const TensorView& value_cache, const TensorView& block_tables,
                           const TensorView& query_start_loc, const TensorView& seq_lens,
                           int max_query_len, const AttentionOptions& opts, Stream stream) {
  if (query.size(0) == 0) return;
  DeviceGuard guard(query.device());
  const int num_kv_heads = static_cast<int>(key.size(1));
  AttnParams p = make_attn_params(out, query, key_cache, value_cache, num_kv_heads, block_tables,
                                  seq_lens, opts);
  p.query_start_loc = query_start_loc.data_as<const int>();
  p.k_new = key.data();
  p.v_new = value.data();
  for (auto [t, l] : {std::pair{&key, &p.knl}, std::pair{&value, &p.vnl}}) {
    l->s_block = t->stride(0);  // (token, 0, head, d) addressing
    l->s_head = t->stride(1);
    l->s_slot = 0;
    l->s_chunk = 0;
    l->x = static_cast<int>(t->size(2));
    l->x_shift = pow2_shift(l->x);
  }
  p.new_vec = vector_ok(key, 16) && vector_ok(value, 16);
  p.pair_chunk = prefill::pair_chunk(p);
  const cudaStream_t s = op_stream(stream, query.device());
  if (const int wg_mode = prefill_wgmma_mode(); wg_mode != 0) {
    const char* why = prefill_wgmma_uncovered(p, query.dtype(), opts.kv_cache_dtype);
    if (why == nullptr) {
      launch_prefill_wgmma(p, query.dtype(), opts.kv_cache_dtype, max_query_len, s);
      check_launch("context_attention_fwd");
      return;
    }
    PAGEDKV_CHECK(wg_mode != 2,
                  "context_attention_fwd: PAGEDKV_PREFILL_WGMMA=2 but the wgmma "
                  "kernel does not cover this call: ",
                  why);
  }
  if (prefill_mma_supported(p, query.dtype())) {
    launch_prefill_mma(p, query.dtype(), opts.kv_cache_dtype, max_query_len, s);
    check_launch("context_attention_fwd");
    return;
  }
  launch_attention(p, query.dtype(), opts.kv_cache_dtype, s, "context_attention_fwd");
}

}  // namespace pagedkv::cuda_ops
