// paged_attention_v1 (single pass: one CTA per sequence and KV group) and paged_attention_v2
// (split-K: one CTA per partition of `partition_size` keys, then an fp32 log-sum-exp reduction),
// with vLLM's semantics for exp_sums / max_logits / tmp_out. Three kernels, the first that covers
// the call runs unless the caller names one (AttentionOptions::kernel): the Hopper one
// (decode_bulk.cuh: bulk copies, transposed tensor-core tiles; sm_90, row layouts), the
// tensor-core one (decode_mma.cuh: fp16/bf16 queries with head sizes that are multiples of 16,
// both layouts) and the CUDA-core one (attention_kernel.cuh: everything, fp32 queries included).
#include <algorithm>

#include "ops/cuda/attention_setup.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/decode_bulk.h"
#include "ops/cuda/decode_mma.h"
#include "ops/cuda/decode_reduce.h"
#include "ops/cuda/device_props.h"
#include "ops/cuda/kernel_choice.h"

namespace pagedkv::cuda_ops {
namespace {

// The kernel that serves the call under the caller's choice (the one place that decides;
// ops::decode_kernel asks it too, so the split-K choice follows the kernel that runs).
AttentionKernel pick_kernel(const AttnParams& p, DType qdtype, KVCacheDType cache,
                            const TensorView& key_cache, const TensorView& value_cache,
                            AttentionKernel choice, const char* op) {
  const bool vec16 = vector_ok(key_cache, 16) && vector_ok(value_cache, 16);
  using K = AttentionKernel;
  return choose_kernel(choice, op, {K::kHopper, K::kTensorCore, K::kCudaCore},
                       [&](K k) -> const char* {
                         switch (k) {
                           case K::kHopper: return decode_bulk_uncovered(p, qdtype, cache, vec16);
                           case K::kTensorCore:
                             return decode_mma_uncovered(p, qdtype, cache, vec16);
                           default: return nullptr;  // the CUDA-core kernel covers every call
                         }
                       });
}

void launch_decode(const AttnParams& p, const TensorView& query, const TensorView& key_cache,
                   const TensorView& value_cache, const AttentionOptions& opts, cudaStream_t s,
                   const char* op) {
  const KVCacheDType cache = opts.kv_cache_dtype;
  const AttentionKernel k =
      pick_kernel(p, query.dtype(), cache, key_cache, value_cache, opts.kernel, op);
  if (p.num_q == 0) return;
  switch (k) {
    case AttentionKernel::kHopper: launch_decode_bulk(p, query.dtype(), cache, s); break;
    case AttentionKernel::kTensorCore: launch_decode_mma(p, query.dtype(), cache, s); break;
    default: launch_attention(p, query.dtype(), cache, s, op); return;  // checks its launch
  }
  check_launch(op);
}

// The balanced decode runs on the Hopper kernel only (the one that reads its work item from the
// plan): another named kernel, or a call that kernel does not cover, is refused by name.
void check_balanced_kernel(const AttnParams& p, DType qdtype, KVCacheDType cache,
                           const TensorView& key_cache, const TensorView& value_cache,
                           AttentionKernel choice, const char* op) {
  PAGEDKV_CHECK(choice == AttentionKernel::kAuto || choice == AttentionKernel::kHopper, op,
                ": kernel '", attention_kernel_name(choice),
                "' has no balanced variant (on CUDA the balanced decode runs on 'hopper')");
  const bool vec16 = vector_ok(key_cache, 16) && vector_ok(value_cache, 16);
  const char* why = decode_bulk_uncovered(p, qdtype, cache, vec16);
  PAGEDKV_CHECK(why == nullptr, op,
                ": the balanced decode runs on kernel 'hopper', which does "
                "not cover this call: ",
                why == nullptr ? "" : why);
}

// Work items one plan may hold on CUDA: the reduction keeps a sequence's weights in shared
// memory (48 KB without opting in).
constexpr int64_t kMaxPlanItems = 12288;

}  // namespace

void paged_attention_balanced(const TensorView& out, const TensorView& exp_sums,
                              const TensorView& max_logits, const TensorView& tmp_out,
                              const TensorView& query, const TensorView& key_cache,
                              const TensorView& value_cache, int num_kv_heads,
                              const TensorView& block_tables, const TensorView& seq_lens,
                              const TensorView& work_items, const TensorView& seq_offsets,
                              const AttentionOptions& opts, const std::optional<TensorView>& lse,
                              Stream stream) {
  constexpr const char* op = "paged_attention_balanced";
  DeviceGuard guard(query.device());
  AttnParams p = make_attn_params(out, query, key_cache, value_cache, num_kv_heads, block_tables,
                                  seq_lens, opts);
  check_balanced_kernel(p, query.dtype(), opts.kv_cache_dtype, key_cache, value_cache, opts.kernel,
                        op);
  PAGEDKV_CHECK(work_items.size(0) <= kMaxPlanItems, "work_items: at most ", kMaxPlanItems,
                " work items on CUDA, got ", work_items.size(0));
  PAGEDKV_CHECK(reinterpret_cast<uintptr_t>(work_items.data()) % 16 == 0,
                "work_items must be 16-byte aligned on CUDA (an item is read as one int4)");
  // Split mode with one partition per row: item r's partial lands in workspace row r.
  p.partition_size = 1;
  p.max_parts = 1;
  p.exp_sums = exp_sums.data_as<float>();
  p.max_logits = max_logits.data_as<float>();
  p.tmp_out = tmp_out.data();
  p.tmp_f32 = true;
  p.work_items = work_items.data_as<const int>();
  p.seq_offsets = seq_offsets.data_as<const int>();
  p.plan_items = static_cast<int>(work_items.size(0));
  p.lse = lse ? lse->data_as<float>() : nullptr;
  const cudaStream_t s = op_stream(stream, query.device());
  if (p.plan_items > 0) {
    launch_decode_bulk(p, query.dtype(), opts.kv_cache_dtype, s);
    check_launch(op);
  }
  launch_decode_reduce(p, query.dtype(), s);
}

int balanced_decode_target(const TensorView& query, const TensorView& key_cache,
                           const TensorView& value_cache, int num_kv_heads,
                           KVCacheDType kv_cache_dtype, AttentionKernel kernel) {
  DeviceGuard guard(query.device());
  AttentionOptions opts;
  opts.kv_cache_dtype = kv_cache_dtype;
  const AttnParams p = make_attn_shape(query, key_cache, value_cache, num_kv_heads, opts);
  check_balanced_kernel(p, query.dtype(), kv_cache_dtype, key_cache, value_cache, kernel,
                        "balanced_decode_target");
  int resident = 1;
  const int per_item = decode_bulk_item_ctas(p, kv_cache_dtype, &resident);
  return std::max(1, sm_count(query.device().id) * resident / std::max(1, per_item));
}

AttentionKernel decode_kernel(const TensorView& query, const TensorView& key_cache,
                              const TensorView& value_cache, int num_kv_heads,
                              KVCacheDType kv_cache_dtype, AttentionKernel kernel) {
  DeviceGuard guard(query.device());
  AttentionOptions opts;
  opts.kv_cache_dtype = kv_cache_dtype;
  const AttnParams p = make_attn_shape(query, key_cache, value_cache, num_kv_heads, opts);
  return pick_kernel(p, query.dtype(), kv_cache_dtype, key_cache, value_cache, kernel,
                     "decode_kernel");
}

void paged_attention_v1(const TensorView& out, const TensorView& query, const TensorView& key_cache,
                        const TensorView& value_cache, int num_kv_heads,
                        const TensorView& block_tables, const TensorView& seq_lens,
                        int /*max_seq_len*/, const AttentionOptions& opts, Stream stream) {
  DeviceGuard guard(query.device());
  AttnParams p = make_attn_params(out, query, key_cache, value_cache, num_kv_heads, block_tables,
                                  seq_lens, opts);
  launch_decode(p, query, key_cache, value_cache, opts, op_stream(stream, query.device()),
                "paged_attention_v1");
}

void paged_attention_v2(const TensorView& out, const TensorView& exp_sums,
                        const TensorView& max_logits, const TensorView& tmp_out,
                        const TensorView& query, const TensorView& key_cache,
                        const TensorView& value_cache, int num_kv_heads,
                        const TensorView& block_tables, const TensorView& seq_lens,
                        int /*max_seq_len*/, const AttentionOptions& opts, int partition_size,
                        Stream stream) {
  DeviceGuard guard(query.device());
  AttnParams p = make_attn_params(out, query, key_cache, value_cache, num_kv_heads, block_tables,
                                  seq_lens, opts);
  if (p.num_q == 0) return;
  // The grid covers every partition the workspace has room for (fixed by the tensors' shapes,
  // not by the data, so a captured CUDA graph stays valid when seq_lens change).
  p.partition_size = partition_size;
  p.max_parts = static_cast<int>(exp_sums.size(2));
  p.exp_sums = exp_sums.data_as<float>();
  p.max_logits = max_logits.data_as<float>();
  p.tmp_out = tmp_out.data();
  p.tmp_f32 = tmp_out.dtype() == DType::kFloat32;
  PAGEDKV_CHECK(p.max_parts <= 32768, "exp_sums: at most 32768 partitions on CUDA");
  const cudaStream_t s = op_stream(stream, query.device());
  launch_decode(p, query, key_cache, value_cache, opts, s, "paged_attention_v2");
  launch_decode_reduce(p, query.dtype(), s);
}

}  // namespace pagedkv::cuda_ops
