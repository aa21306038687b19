// paged_attention_balanced and its planner over arrays (include/pagedkv/ops.h): argument checks
// for both backends, the host plan's values, then dispatch to the CPU or CUDA kernels.
#include <algorithm>
#include <string>
#include <vector>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/parallel.h"
#include "ops/decode_checks.h"
#include "pagedkv/decode_plan.h"
#ifdef PAGEDKV_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace pagedkv::ops {
namespace {

// A host plan's values: every used item (seq >= 0) writes its own row within the capacity, and
// each sequence's rows (seq_offsets[s] .. seq_offsets[s + 1] - 1, in order) hold items of that
// sequence covering its visible keys in order, so the merge sees every key once.
void check_host_plan(const TensorView& work_items, const TensorView& seq_offsets,
                     const TensorView& seq_lens, int sliding_window) {
  const int64_t S = seq_lens.size(0), cap = work_items.size(0);
  const int32_t* w = work_items.data_as<const int32_t>();
  const int32_t* off = seq_offsets.data_as<const int32_t>();
  std::vector<int64_t> item_of_row(static_cast<size_t>(cap), -1);
  for (int64_t i = 0; i < cap; ++i) {
    const int32_t* item = w + i * kBalancedItemInts;
    if (item[0] < 0) continue;  // unused
    PAGEDKV_CHECK(item[0] < S && item[3] >= 0 && item[3] < cap && item_of_row[item[3]] < 0,
                  "work_items[", i, "] = (", item[0], ", ", item[1], ", ", item[2], ", ", item[3],
                  ") must name a sequence below ", S, " and a row below ", cap,
                  " that no other item writes");
    item_of_row[item[3]] = i;
  }
  PAGEDKV_CHECK(off[0] == 0, "seq_offsets[0] = ", off[0], " must be 0");
  for (int64_t s = 0; s < S; ++s) {
    PAGEDKV_CHECK(off[s] <= off[s + 1] && off[s + 1] <= cap, "seq_offsets[", s + 1,
                  "] = ", off[s + 1], " must be in [seq_offsets[", s, "] = ", off[s],
                  ", capacity = ", cap, "]");
    const int64_t len = detail::host_int(seq_lens, s);
    int64_t next = sliding_window > 0 ? std::max<int64_t>(0, len - sliding_window) : 0;
    for (int64_t r = off[s]; r < off[s + 1]; ++r) {
      const int64_t i = item_of_row[r];
      const int32_t* item = i < 0 ? nullptr : w + i * kBalancedItemInts;
      PAGEDKV_CHECK(
          item != nullptr && item[0] == s && item[1] == next && item[2] > item[1] && item[2] <= len,
          "work_items: row ", r, " must hold sequence ", s, "'s next keys [", next,
          ", hi) with hi <= seq_lens[", s, "] = ", len, ", got ",
          i < 0 ? std::string("no item")
                : ::pagedkv::detail::concat("item ", i, " = (", item[0], ", ", item[1], ", ",
                                            item[2], ")"));
      next = item[2];
    }
    PAGEDKV_CHECK(next == len, "work_items: sequence ", s, "'s items end at key ", next,
                  " but seq_lens[", s, "] = ", len);
  }
}

}  // namespace

void paged_attention_balanced(const TensorView& out, const TensorView& exp_sums,
                              const TensorView& max_logits, const TensorView& tmp_out,
                              const TensorView& query, const TensorView& key_cache,
                              const TensorView& value_cache, int num_kv_heads,
                              const TensorView& block_tables, const TensorView& seq_lens,
                              const TensorView& work_items, const TensorView& seq_offsets,
                              int max_seq_len, const AttentionOptions& opts,
                              const std::optional<TensorView>& lse, Stream stream) {
  const TensorView& alibi = opts.alibi_slopes ? *opts.alibi_slopes : query;
  detail::check_devices({{&query, "query"},
                         {&out, "out"},
                         {&exp_sums, "exp_sums"},
                         {&max_logits, "max_logits"},
                         {&tmp_out, "tmp_out"},
                         {&key_cache, "key_cache"},
                         {&value_cache, "value_cache"},
                         {&block_tables, "block_tables"},
                         {&seq_lens, "seq_lens"},
                         {&work_items, "work_items"},
                         {&seq_offsets, "seq_offsets"},
                         {&alibi, "alibi_slopes"}});
  check_decode(out, query, key_cache, value_cache, num_kv_heads, block_tables, seq_lens,
               max_seq_len, opts);
  const int64_t S = query.size(0), H = query.size(1), D = query.size(2);
  check_dtype(work_items, "work_items", {DType::kInt32});
  check_shape(work_items, "work_items", {-1, kBalancedItemInts});
  check_contiguous(work_items, "work_items");
  check_dtype(seq_offsets, "seq_offsets", {DType::kInt32});
  check_shape(seq_offsets, "seq_offsets", {S + 1});
  check_contiguous(seq_offsets, "seq_offsets");
  const int64_t cap = work_items.size(0);
  check_dtype(exp_sums, "exp_sums", {DType::kFloat32});
  check_dtype(max_logits, "max_logits", {DType::kFloat32});
  check_dtype(tmp_out, "tmp_out", {DType::kFloat32});
  check_shape(exp_sums, "exp_sums", {cap, H});
  check_shape(max_logits, "max_logits", {cap, H});
  check_shape(tmp_out, "tmp_out", {cap, H, D});
  check_contiguous(exp_sums, "exp_sums");
  check_contiguous(max_logits, "max_logits");
  check_contiguous(tmp_out, "tmp_out");
  const detail::Named written[] = {
      {&exp_sums, "exp_sums"}, {&max_logits, "max_logits"}, {&tmp_out, "tmp_out"}};
  for (const detail::Named& w : written) {
    detail::check_no_overlap(w, {{&out, "out"},
                                 {&query, "query"},
                                 {&key_cache, "key_cache"},
                                 {&value_cache, "value_cache"},
                                 {&block_tables, "block_tables"},
                                 {&seq_lens, "seq_lens"},
                                 {&work_items, "work_items"},
                                 {&seq_offsets, "seq_offsets"},
                                 {&alibi, "alibi_slopes"}});
  }
  detail::check_no_overlap(written[0], {written[1], written[2]});
  detail::check_no_overlap(written[1], {written[2]});
  detail::check_no_overlap({&out, "out"},
                           {{&work_items, "work_items"}, {&seq_offsets, "seq_offsets"}});
  if (lse) {
    detail::check_devices({{&query, "query"}, {&*lse, "lse"}});
    check_dtype(*lse, "lse", {DType::kFloat32});
    check_shape(*lse, "lse", {H, S});
    check_contiguous(*lse, "lse");
    detail::check_no_overlap({&*lse, "lse"}, {{&out, "out"},
                                              {&query, "query"},
                                              {&key_cache, "key_cache"},
                                              {&value_cache, "value_cache"},
                                              written[0],
                                              written[1],
                                              written[2],
                                              {&seq_lens, "seq_lens"},
                                              {&work_items, "work_items"},
                                              {&seq_offsets, "seq_offsets"}});
  }
  if (!query.device().is_cuda()) {
    check_host_plan(work_items, seq_offsets, seq_lens, opts.sliding_window);
    if (S == 0) return;
    cpu_ops::paged_attention_balanced(out, exp_sums, max_logits, tmp_out, query, key_cache,
                                      value_cache, num_kv_heads, block_tables, seq_lens, work_items,
                                      seq_offsets, opts, lse);
    return;
  }
#ifdef PAGEDKV_WITH_CUDA
  if (S == 0) return;
  cuda_ops::paged_attention_balanced(out, exp_sums, max_logits, tmp_out, query, key_cache,
                                     value_cache, num_kv_heads, block_tables, seq_lens, work_items,
                                     seq_offsets, opts, lse, stream);
#else
  (void)stream;
  throw ValueError(::pagedkv::detail::concat("paged_attention_balanced: the arrays are on ",
                                             query.device().str(),
                                             " but pagedkv was built without CUDA"));
#endif
}

int plan_balanced_decode(const TensorView& seq_lens, const TensorView& work_items,
                         const TensorView& seq_offsets, int target_items, int sliding_window,
                         int min_chunk) {
  const detail::Named arrays[] = {
      {&seq_lens, "seq_lens"}, {&work_items, "work_items"}, {&seq_offsets, "seq_offsets"}};
  for (const detail::Named& a : arrays) {
    PAGEDKV_CHECK(!a.t->device().is_cuda(), "plan_balanced_decode: ", a.name,
                  " must be a host array (the plan is made on the host, then copied)");
    check_dtype(*a.t, a.name, {DType::kInt32});
  }
  check_shape(seq_lens, "seq_lens", {-1});
  check_contiguous(seq_lens, "seq_lens");
  check_shape(work_items, "work_items", {-1, kBalancedItemInts});
  check_contiguous(work_items, "work_items");
  check_shape(seq_offsets, "seq_offsets", {seq_lens.size(0) + 1});
  check_contiguous(seq_offsets, "seq_offsets");
  detail::check_data({arrays[0], arrays[1], arrays[2]});
  detail::check_no_overlap(arrays[1], {arrays[0], arrays[2]});
  detail::check_no_overlap(arrays[2], {arrays[0]});
  return ::pagedkv::plan_balanced_decode(
      seq_lens.data_as<const int32_t>(), static_cast<int>(seq_lens.size(0)), sliding_window,
      target_items, min_chunk, static_cast<int>(work_items.size(0)), work_items.data_as<int32_t>(),
      seq_offsets.data_as<int32_t>());
}

int balanced_decode_target(const TensorView& query, const TensorView& key_cache,
                           const TensorView& value_cache, int num_kv_heads,
                           KVCacheDType kv_cache_dtype, AttentionKernel kernel) {
  detail::check_devices(
      {{&query, "query"}, {&key_cache, "key_cache"}, {&value_cache, "value_cache"}});
  check_decode_query(query, key_cache, value_cache, num_kv_heads, kv_cache_dtype);
  AttentionOptions o;  // the kernel's device (check_decode does it for the op)
  o.kernel = kernel;
  detail::check_attention_options(o, query.size(1), query.device());
  if (!query.device().is_cuda()) {
    return std::max(1, 4 * cpu_ops::num_threads() / num_kv_heads);
  }
#ifdef PAGEDKV_WITH_CUDA
  return cuda_ops::balanced_decode_target(query, key_cache, value_cache, num_kv_heads,
                                          kv_cache_dtype, kernel);
#else
  throw ValueError(::pagedkv::detail::concat("balanced_decode_target: the arrays are on ",
                                             query.device().str(),
                                             " but pagedkv was built without CUDA"));
#endif
}

}  // namespace pagedkv::ops
