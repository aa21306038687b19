// context_attention_fwd: prefill / extend attention over a paged prefix (chunked prefill, prefix
// reuse). Query token t of sequence s sits at position ctx_len(s) + (t - query_start_loc[s]) and
// attends causally to the cached context (from the paged cache) and to the new tokens up to
// itself (from key/value). Three kernels, the first that covers the call runs unless the caller
// names one (AttentionOptions::kernel): on Hopper the wgmma kernel (prefill_wgmma_kernel.cuh;
// fp16/bf16, head sizes 64 and 128, NHD caches in the query dtype or fp8), the mma.sync
// tensor-core kernel (prefill_mma_kernel.cuh; fp16/bf16) and the CUDA-core kernel with one query
// token per CTA (everything).
#include "ops/cuda/attention_setup.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kernel_choice.h"
#include "ops/cuda/prefill_mma.h"
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
  const cudaStream_t s = op_stream(stream, query.device());
  const KVCacheDType cache = opts.kv_cache_dtype;
  const DType qdtype = query.dtype();
  constexpr const char* kOp = "context_attention_fwd";
  using K = AttentionKernel;
  const K k = choose_kernel(opts.kernel, kOp, {K::kHopper, K::kTensorCore, K::kCudaCore},
                            [&](K kernel) -> const char* {
                              switch (kernel) {
                                case K::kHopper: return prefill_wgmma_uncovered(p, qdtype, cache);
                                case K::kTensorCore: return prefill_mma_uncovered(p, qdtype);
                                default: return nullptr;  // the CUDA-core kernel covers all
                              }
                            });
  switch (k) {
    case K::kHopper: launch_prefill_wgmma(p, qdtype, cache, max_query_len, s); break;
    case K::kTensorCore: launch_prefill_mma(p, qdtype, cache, max_query_len, s); break;
    default: launch_attention(p, qdtype, cache, s, kOp); return;  // checks its launch
  }
  check_launch(kOp);
}

}  // namespace pagedkv::cuda_ops
