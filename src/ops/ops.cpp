// The public ops (include/pagedkv/ops.h): validate every argument once for both backends, then
// dispatch on the device of the arrays to the CPU kernels or, when built, the CUDA kernels.
#include "pagedkv/ops.h"

#include <algorithm>
#include <iterator>
#include <numeric>
#include <string>

#include "ops/cpu/cpu_ops.h"
#include "ops/decode_checks.h"
#include "ops/validate.h"
#ifdef PAGEDKV_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_props.h"
#endif

namespace pagedkv {

namespace {

// "'a', 'b' or 'c'" from a list of names (the error messages quote the one list).
template <size_t N>
std::string quoted_choices(const std::string_view (&names)[N]) {
  std::string s;
  for (size_t i = 0; i < N; ++i) {
    s += i == 0 ? "'" : i + 1 == N ? " or '" : ", '";
    s += names[i];
    s += "'";
  }
  return s;
}

}  // namespace

KVCacheDType parse_kv_cache_dtype(std::string_view name) {
  static_assert(std::size(kKVCacheDTypeNames) == 4, "the parse below covers every name");
  if (name == kKVCacheDTypeNames[0]) return KVCacheDType::kAuto;
  if (name == kKVCacheDTypeNames[1] || name == kKVCacheDTypeNames[2]) {
    return KVCacheDType::kFp8E4M3;
  }
  if (name == kKVCacheDTypeNames[3]) return KVCacheDType::kFp8E5M2;
  throw ValueError(::pagedkv::detail::concat(
      "kv_cache_dtype must be ", quoted_choices(kKVCacheDTypeNames), ", got '", name, "'"));
}

AttentionKernel parse_attention_kernel(std::string_view name) {
  for (size_t i = 0; i < std::size(kAttentionKernelNames); ++i) {
    if (name == kAttentionKernelNames[i]) return static_cast<AttentionKernel>(i);
  }
  throw ValueError(::pagedkv::detail::concat(
      "kernel must be ", quoted_choices(kAttentionKernelNames), ", got '", name, "'"));
}

std::string_view attention_kernel_name(AttentionKernel kernel) {
  return kAttentionKernelNames[static_cast<size_t>(kernel)];
}

bool is_supported_head_size(int head_size) {
  return std::find(std::begin(kSupportedHeadSizes), std::end(kSupportedHeadSizes), head_size) !=
         std::end(kSupportedHeadSizes);
}

namespace ops {
namespace {
using detail::CacheGeometry;
using detail::check_rows;

// Runs the CUDA kernel when `first` lives on the GPU, the CPU kernel otherwise.
#ifdef PAGEDKV_WITH_CUDA
#define PAGEDKV_DISPATCH(first, op, cpu_args, cuda_args) \
  do {                                                   \
    if ((first).device().is_cuda()) {                    \
      cuda_ops::op cuda_args;                            \
    } else {                                             \
      cpu_ops::op cpu_args;                              \
    }                                                    \
  } while (0)
#else
#define PAGEDKV_DISPATCH(first, op, cpu_args, cuda_args)                                           \
  do {                                                                                             \
    PAGEDKV_CHECK(!(first).device().is_cuda(), #op ": the arrays are on ", (first).device().str(), \
                  " but pagedkv was built without CUDA");                                          \
    cpu_ops::op cpu_args;                                                                          \
  } while (0)
#endif

// True when a validated call has nothing to do (0 sequences, tokens or blocks): it returns
// before dispatch, since a CUDA launch with an empty grid is an error and the kernels need
// not handle the case. A build without CUDA still rejects CUDA arrays.
bool no_work(const TensorView& first, int64_t items) {
#ifndef PAGEDKV_WITH_CUDA
  PAGEDKV_CHECK(!first.device().is_cuda(), "the arrays are on ", first.device().str(),
                " but pagedkv was built without CUDA");
#else
  (void)first;
#endif
  return items == 0;
}

void check_cache_write(const TensorView& key, const TensorView& value, const TensorView& key_cache,
                       const TensorView& value_cache, const TensorView& slot_mapping,
                       KVCacheDType kv_dtype, const Scale& k_scale, const Scale& v_scale,
                       KVLayout layout) {
  detail::check_devices({{&key, "key"},
                         {&value, "value"},
                         {&key_cache, "key_cache"},
                         {&value_cache, "value_cache"},
                         {&slot_mapping, "slot_mapping"}});
  detail::check_float(key, "key");
  check_rows(key, "key", -1, -1, -1);
  check_rows(value, "value", key.size(0), key.size(1), key.size(2));
  check_dtype(value, "value", {key.dtype()});
  const CacheGeometry g =
      detail::check_kv_caches(key_cache, value_cache, kv_dtype, key.dtype(), &layout);
  PAGEDKV_CHECK(g.num_kv_heads == key.size(1) && g.head_size == key.size(2), "key has shape ",
                key.shape_str(), " but key_cache holds ", g.num_kv_heads, " heads of size ",
                g.head_size);
  detail::check_scales(k_scale, v_scale, key.device());
  check_dtype(slot_mapping, "slot_mapping", {DType::kInt64});
  check_ndim(slot_mapping, "slot_mapping", 1);
  detail::check_cuda_dense(slot_mapping, "slot_mapping");
  // The caches are written: each element once, and nothing the op reads may live in them.
  detail::check_no_self_overlap(key_cache, "key_cache");
  detail::check_no_self_overlap(value_cache, "value_cache");
  PAGEDKV_CHECK(key_cache.data() != value_cache.data() || key_cache.numel() == 0,
                "key_cache and value_cache are the same array: the values would overwrite the "
                "keys");
  for (const auto& [cache, name] :
       {std::pair{&key_cache, "key_cache"}, {&value_cache, "value_cache"}})
    detail::check_no_overlap({cache, name},
                             {{&key, "key"}, {&value, "value"}, {&slot_mapping, "slot_mapping"}});
  PAGEDKV_CHECK(slot_mapping.size(0) <= key.size(0), "slot_mapping has ", slot_mapping.size(0),
                " entries but key has only ", key.size(0), " tokens");
  if (slot_mapping.device().is_cuda()) return;
  const int64_t slots = g.num_blocks * g.block_size;
  for (int64_t i = 0; i < slot_mapping.size(0); ++i) {
    const int64_t s = detail::host_int(slot_mapping, i);
    PAGEDKV_CHECK(s < slots, "slot_mapping[", i, "] = ", s, " is out of range: the cache has ",
                  slots, " slots (num_blocks * block_size)");
  }
}

}  // namespace

// Shared with the balanced decode (decode_balanced.cpp): decode_checks.h.
CacheGeometry check_decode_query(const TensorView& query, const TensorView& key_cache,
                                 const TensorView& value_cache, int num_kv_heads,
                                 KVCacheDType kv_dtype) {
  detail::check_float(query, "query");
  check_rows(query, "query", -1, -1, -1);
  const int64_t H = query.size(1), D = query.size(2);
  detail::check_head_size(D, "query");
  PAGEDKV_CHECK(num_kv_heads > 0 && H % num_kv_heads == 0, "num_kv_heads = ", num_kv_heads,
                " must be positive and divide the number of query heads (", H, ")");
  const CacheGeometry g =
      detail::check_kv_caches(key_cache, value_cache, kv_dtype, query.dtype(), nullptr);
  PAGEDKV_CHECK(g.num_kv_heads == num_kv_heads, "key_cache has ", g.num_kv_heads,
                " KV heads but num_kv_heads = ", num_kv_heads);
  PAGEDKV_CHECK(g.head_size == D, "key_cache has head size ", g.head_size, " but query has ", D);
  return g;
}

CacheGeometry check_decode(const TensorView& out, const TensorView& query,
                           const TensorView& key_cache, const TensorView& value_cache,
                           int num_kv_heads, const TensorView& block_tables,
                           const TensorView& seq_lens, int max_seq_len,
                           const AttentionOptions& opts) {
  const CacheGeometry g =
      check_decode_query(query, key_cache, value_cache, num_kv_heads, opts.kv_cache_dtype);
  const int64_t S = query.size(0), H = query.size(1), D = query.size(2);
  check_rows(out, "out", S, H, D);
  check_dtype(out, "out", {query.dtype()});
  check_dtype(block_tables, "block_tables", {DType::kInt32});
  check_shape(block_tables, "block_tables", {S, -1});
  check_dtype(seq_lens, "seq_lens", {DType::kInt32});
  check_shape(seq_lens, "seq_lens", {S});
  PAGEDKV_CHECK(max_seq_len >= 0, "max_seq_len must be >= 0, got ", max_seq_len);
  detail::check_attention_options(opts, H, query.device());
  detail::check_cuda_dense(block_tables, "block_tables");
  detail::check_cuda_dense(seq_lens, "seq_lens");
  const TensorView none;
  detail::check_no_self_overlap(out, "out");
  detail::check_no_overlap({&out, "out"},
                           {{&query, "query"},
                            {&key_cache, "key_cache"},
                            {&value_cache, "value_cache"},
                            {&block_tables, "block_tables"},
                            {&seq_lens, "seq_lens"},
                            {opts.alibi_slopes ? &*opts.alibi_slopes : &none, "alibi_slopes"}});
  if (seq_lens.device().is_cuda()) return g;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t len = detail::host_int(seq_lens, s);
    PAGEDKV_CHECK(len >= 0 && len <= max_seq_len, "seq_lens[", s, "] = ", len,
                  " must be in [0, max_seq_len = ", max_seq_len, "]");
    const int64_t first =
        opts.sliding_window > 0 ? std::max<int64_t>(0, len - opts.sliding_window) : 0;
    detail::check_seq_blocks(block_tables, s, first, len, g);
  }
  return g;
}

void reshape_and_cache(const TensorView& key, const TensorView& value, const TensorView& key_cache,
                       const TensorView& value_cache, const TensorView& slot_mapping,
                       KVCacheDType kv_cache_dtype, const Scale& k_scale, const Scale& v_scale,
                       Stream stream) {
  check_cache_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                    v_scale, KVLayout::kVLLM);
  if (no_work(key, slot_mapping.size(0))) return;
  PAGEDKV_DISPATCH(
      key, reshape_and_cache,
      (key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
       cpu_ops::host_scale(k_scale), cpu_ops::host_scale(v_scale)),
      (key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale, stream));
  (void)stream;
}

void reshape_and_cache_flash(const TensorView& key, const TensorView& value,
                             const TensorView& key_cache, const TensorView& value_cache,
                             const TensorView& slot_mapping, KVCacheDType kv_cache_dtype,
                             const Scale& k_scale, const Scale& v_scale, Stream stream) {
  check_cache_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                    v_scale, KVLayout::kNHD);
  if (no_work(key, slot_mapping.size(0))) return;
  PAGEDKV_DISPATCH(
      key, reshape_and_cache_flash,
      (key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
       cpu_ops::host_scale(k_scale), cpu_ops::host_scale(v_scale)),
      (key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale, stream));
  (void)stream;
}

void paged_attention_v1(const TensorView& out, const TensorView& query, const TensorView& key_cache,
                        const TensorView& value_cache, int num_kv_heads,
                        const TensorView& block_tables, const TensorView& seq_lens, int max_seq_len,
                        const AttentionOptions& opts, Stream stream) {
  const TensorView& alibi = opts.alibi_slopes ? *opts.alibi_slopes : query;
  detail::check_devices({{&query, "query"},
                         {&out, "out"},
                         {&key_cache, "key_cache"},
                         {&value_cache, "value_cache"},
                         {&block_tables, "block_tables"},
                         {&seq_lens, "seq_lens"},
                         {&alibi, "alibi_slopes"}});
  check_decode(out, query, key_cache, value_cache, num_kv_heads, block_tables, seq_lens,
               max_seq_len, opts);
  if (no_work(query, out.numel())) return;
  PAGEDKV_DISPATCH(
      query, paged_attention_v1,
      (out, query, key_cache, value_cache, num_kv_heads, block_tables, seq_lens, max_seq_len, opts),
      (out, query, key_cache, value_cache, num_kv_heads, block_tables, seq_lens, max_seq_len, opts,
       stream));
  (void)stream;
}

void paged_attention_v2(const TensorView& out, const TensorView& exp_sums,
                        const TensorView& max_logits, const TensorView& tmp_out,
                        const TensorView& query, const TensorView& key_cache,
                        const TensorView& value_cache, int num_kv_heads,
                        const TensorView& block_tables, const TensorView& seq_lens, int max_seq_len,
                        const AttentionOptions& opts, int partition_size, Stream stream) {
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
                         {&alibi, "alibi_slopes"}});
  const CacheGeometry g = check_decode(out, query, key_cache, value_cache, num_kv_heads,
                                       block_tables, seq_lens, max_seq_len, opts);
  PAGEDKV_CHECK(partition_size > 0 && partition_size % g.block_size == 0,
                "partition_size = ", partition_size, " must be a positive multiple of block_size (",
                g.block_size, ")");
  const int64_t S = query.size(0), H = query.size(1), D = query.size(2);
  const int64_t parts = (static_cast<int64_t>(max_seq_len) + partition_size - 1) / partition_size;
  check_dtype(exp_sums, "exp_sums", {DType::kFloat32});
  check_dtype(max_logits, "max_logits", {DType::kFloat32});
  check_shape(exp_sums, "exp_sums", {S, H, -1});
  check_shape(max_logits, "max_logits", {S, H, exp_sums.size(2)});
  check_contiguous(exp_sums, "exp_sums");
  check_contiguous(max_logits, "max_logits");
  PAGEDKV_CHECK(exp_sums.size(2) >= parts, "exp_sums has ", exp_sums.size(2),
                " partitions but max_seq_len = ", max_seq_len, " needs ", parts);
  check_dtype(tmp_out, "tmp_out", {DType::kFloat32, query.dtype()});
  check_shape(tmp_out, "tmp_out", {S, H, exp_sums.size(2), D});
  check_contiguous(tmp_out, "tmp_out");
  // The partials are written too (contiguous, so each element once): apart from every other
  // array of the call (`out` against the inputs is checked by check_decode).
  const detail::Named written[] = {
      {&exp_sums, "exp_sums"}, {&max_logits, "max_logits"}, {&tmp_out, "tmp_out"}};
  for (const detail::Named& w : written) {
    detail::check_no_overlap(w, {{&out, "out"},
                                 {&query, "query"},
                                 {&key_cache, "key_cache"},
                                 {&value_cache, "value_cache"},
                                 {&block_tables, "block_tables"},
                                 {&seq_lens, "seq_lens"},
                                 {&alibi, "alibi_slopes"}});
  }
  detail::check_no_overlap(written[0], {written[1], written[2]});
  detail::check_no_overlap(written[1], {written[2]});
  if (no_work(query, out.numel())) return;
  PAGEDKV_DISPATCH(query, paged_attention_v2,
                   (out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads,
                    block_tables, seq_lens, max_seq_len, opts, partition_size),
                   (out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads,
                    block_tables, seq_lens, max_seq_len, opts, partition_size, stream));
  (void)stream;
}

namespace {

// Validates a decode call's query and caches, then asks the backend which kernel runs it under
// the choice `kernel`.
AttentionKernel choose_decode(const TensorView& query, const TensorView& key_cache,
                              const TensorView& value_cache, int num_kv_heads,
                              KVCacheDType kv_cache_dtype, AttentionKernel kernel,
                              CacheGeometry& g) {
  detail::check_devices(
      {{&query, "query"}, {&key_cache, "key_cache"}, {&value_cache, "value_cache"}});
  g = check_decode_query(query, key_cache, value_cache, num_kv_heads, kv_cache_dtype);
  AttentionOptions o;
  o.kernel = kernel;
  detail::check_attention_options(o, query.size(1), query.device());
  if (!query.device().is_cuda()) return AttentionKernel::kCpu;
#ifdef PAGEDKV_WITH_CUDA
  return cuda_ops::decode_kernel(query, key_cache, value_cache, num_kv_heads, kv_cache_dtype,
                                 kernel);
#else
  throw ValueError(::pagedkv::detail::concat("decode_kernel: the arrays are on ",
                                             query.device().str(),
                                             " but pagedkv was built without CUDA"));
#endif
}

}  // namespace

AttentionKernel decode_kernel(const TensorView& query, const TensorView& key_cache,
                              const TensorView& value_cache, int num_kv_heads,
                              KVCacheDType kv_cache_dtype, AttentionKernel kernel) {
  CacheGeometry g;
  return choose_decode(query, key_cache, value_cache, num_kv_heads, kv_cache_dtype, kernel, g);
}

int decode_partition_size(AttentionKernel kernel, int num_seqs, int num_heads, int num_kv_heads,
                          int max_seq_len, int block_size, int num_sms,
                          KVCacheDType kv_cache_dtype) {
  PAGEDKV_CHECK(num_seqs >= 0 && num_heads > 0 && num_kv_heads > 0 && num_sms >= 0,
                "num_seqs, num_heads, num_kv_heads and num_sms must be >= 0 (heads > 0), got ",
                num_seqs, ", ", num_heads, ", ", num_kv_heads, ", ", num_sms);
  PAGEDKV_CHECK(block_size > 0, "block_size must be positive, got ", block_size);
  // The rule sizes CTAs by query heads per KV head: a group that is not whole (e.g. 2 query heads
  // over 8 KV heads) is no real call, and the answer for it would be meaningless.
  PAGEDKV_CHECK(num_heads % num_kv_heads == 0, "num_kv_heads = ", num_kv_heads,
                " must divide num_heads = ", num_heads);
  if (max_seq_len <= 0) return 0;
  PAGEDKV_CHECK(kernel != AttentionKernel::kAuto,
                "kernel: the rule needs the kernel that runs ('auto' is a choice, not a kernel)");
  if (kernel == AttentionKernel::kCpu) {  // vLLM's rule, in whole blocks
    const int parts = (max_seq_len + kPartitionSize - 1) / kPartitionSize;
    const bool v1 = max_seq_len <= 8192 && (parts == 1 || int64_t(num_seqs) * num_heads > 512);
    const int64_t size = (kPartitionSize + block_size - 1) / block_size * int64_t(block_size);
    return v1 || size >= max_seq_len ? 0 : static_cast<int>(size);
  }
  const bool fp8 = kv_cache_dtype != KVCacheDType::kAuto;
  const bool hopper = kernel == AttentionKernel::kHopper;
  const int heads_per_cta = kernel == AttentionKernel::kCudaCore ? 8 : 16;
  const int per_sm = hopper                                   ? (fp8 ? 4 : 1)
                     : kernel == AttentionKernel::kTensorCore ? (fp8 ? 4 : 2)
                                                              : 8;
  const int group = std::max(1, num_heads / num_kv_heads);
  const int64_t ctas = std::max<int64_t>(
      1, int64_t(num_seqs) * num_kv_heads * ((group + heads_per_cta - 1) / heads_per_cta));
  const int64_t parts = int64_t(per_sm) * num_sms / ctas;
  // Hopper fp8: two partitions (an unsplit grid already near 2 CTAs per SM) lose more to the
  // shorter CTAs and the reduction than the fuller grid gains (H100, 32x8192: 196 us unsplit,
  // 209 us in two parts), so it splits only where that at least triples the CTAs.
  if (parts < (hopper && fp8 ? 3 : 2)) return 0;
  // Partitions are whole 16-key chunks and whole blocks.
  const int64_t unit = int64_t(block_size) * 16 / std::gcd(block_size, 16);
  const int64_t least = hopper && fp8 ? 256 : 128;
  const int64_t size = std::max((max_seq_len + parts * unit - 1) / (parts * unit) * unit,
                                (least + unit - 1) / unit * unit);
  return size >= max_seq_len ? 0 : static_cast<int>(size);
}

int decode_partition_size(const TensorView& query, const TensorView& key_cache,
                          const TensorView& value_cache, int num_kv_heads, int max_seq_len,
                          KVCacheDType kv_cache_dtype, AttentionKernel kernel) {
  CacheGeometry g;
  const AttentionKernel runs =
      choose_decode(query, key_cache, value_cache, num_kv_heads, kv_cache_dtype, kernel, g);
  PAGEDKV_CHECK(max_seq_len >= 0, "max_seq_len must be >= 0, got ", max_seq_len);
  int sms = 0;
#ifdef PAGEDKV_WITH_CUDA
  if (runs != AttentionKernel::kCpu) sms = cuda_ops::sm_count(query.device().id);
#endif
  return decode_partition_size(runs, static_cast<int>(query.size(0)),
                               static_cast<int>(query.size(1)), num_kv_heads, max_seq_len,
                               static_cast<int>(g.block_size), sms, kv_cache_dtype);
}

void context_attention_fwd(const TensorView& out, const TensorView& query, const TensorView& key,
                           const TensorView& value, const TensorView& key_cache,
                           const TensorView& value_cache, const TensorView& block_tables,
                           const TensorView& query_start_loc, const TensorView& seq_lens,
                           int max_query_len, const AttentionOptions& opts, Stream stream) {
  const TensorView& alibi = opts.alibi_slopes ? *opts.alibi_slopes : query;
  const detail::Named reads[] = {{&query, "query"},
                                 {&key, "key"},
                                 {&value, "value"},
                                 {&key_cache, "key_cache"},
                                 {&value_cache, "value_cache"},
                                 {&block_tables, "block_tables"},
                                 {&query_start_loc, "query_start_loc"},
                                 {&seq_lens, "seq_lens"},
                                 {&alibi, "alibi_slopes"}};
  detail::check_devices({reads[0], {&out, "out"}});
  detail::check_devices(reads);
  detail::check_float(query, "query");
  check_rows(query, "query", -1, -1, -1);
  const int64_t T = query.size(0), H = query.size(1), D = query.size(2);
  check_rows(out, "out", T, H, D);
  check_dtype(out, "out", {query.dtype()});
  detail::check_head_size(D, "query");
  check_rows(key, "key", -1, -1, D);
  check_rows(value, "value", key.size(0), key.size(1), D);
  check_dtype(key, "key", {query.dtype()});
  check_dtype(value, "value", {query.dtype()});
  const int64_t KVH = key.size(1);
  PAGEDKV_CHECK(KVH > 0 && H % KVH == 0, "key has ", KVH, " heads, which must divide the ", H,
                " query heads");
  const CacheGeometry g =
      detail::check_kv_caches(key_cache, value_cache, opts.kv_cache_dtype, query.dtype(), nullptr);
  PAGEDKV_CHECK(g.num_kv_heads == KVH && g.head_size == D, "key_cache holds ", g.num_kv_heads,
                " heads of size ", g.head_size, " but key has ", KVH, " heads of size ", D);
  check_dtype(seq_lens, "seq_lens", {DType::kInt32});
  check_ndim(seq_lens, "seq_lens", 1);
  const int64_t n = seq_lens.size(0);
  check_dtype(query_start_loc, "query_start_loc", {DType::kInt32});
  check_shape(query_start_loc, "query_start_loc", {n + 1});
  check_dtype(block_tables, "block_tables", {DType::kInt32});
  check_shape(block_tables, "block_tables", {n, -1});
  PAGEDKV_CHECK(max_query_len >= 0, "max_query_len must be >= 0, got ", max_query_len);
  detail::check_attention_options(opts, H, query.device());
  detail::check_cuda_dense(block_tables, "block_tables");
  detail::check_cuda_dense(query_start_loc, "query_start_loc");
  detail::check_cuda_dense(seq_lens, "seq_lens");
  detail::check_no_self_overlap(out, "out");
  detail::check_no_overlap({&out, "out"}, reads);
  if (!query.device().is_cuda()) {
    PAGEDKV_CHECK(n == 0 || detail::host_int(query_start_loc, 0) == 0,
                  "query_start_loc[0] must be 0");
    for (int64_t s = 0; s < n; ++s) {
      const int64_t q0 = detail::host_int(query_start_loc, s);
      const int64_t q1 = detail::host_int(query_start_loc, s + 1);
      const int64_t len = detail::host_int(seq_lens, s);
      PAGEDKV_CHECK(q1 >= q0 && q1 - q0 <= max_query_len, "query_start_loc: sequence ", s, " has ",
                    q1 - q0, " query tokens (must be in [0, max_query_len = ", max_query_len, "])");
      PAGEDKV_CHECK(q1 <= T && q1 <= key.size(0), "query_start_loc[", s + 1, "] = ", q1,
                    " exceeds the ", std::min(T, key.size(0)), " tokens of query/key");
      PAGEDKV_CHECK(len >= q1 - q0, "seq_lens[", s, "] = ", len, " is smaller than its ", q1 - q0,
                    " query tokens");
      const int64_t ctx = len - (q1 - q0);
      // Context keys visible to the first query token (position ctx) under the window.
      const int64_t first =
          opts.sliding_window > 0 ? std::max<int64_t>(0, ctx - opts.sliding_window + 1) : 0;
      detail::check_seq_blocks(block_tables, s, first, ctx, g);
    }
  }
  if (no_work(query, out.numel())) return;
  PAGEDKV_DISPATCH(query, context_attention_fwd,
                   (out, query, key, value, key_cache, value_cache, block_tables, query_start_loc,
                    seq_lens, max_query_len, opts),
                   (out, query, key, value, key_cache, value_cache, block_tables, query_start_loc,
                    seq_lens, max_query_len, opts, stream));
  (void)stream;
}

void copy_blocks(const std::vector<TensorView>& key_caches,
                 const std::vector<TensorView>& value_caches, const TensorView& block_mapping,
                 Stream stream) {
  PAGEDKV_CHECK(key_caches.size() == value_caches.size(), "key_caches has ", key_caches.size(),
                " layers but value_caches has ", value_caches.size());
  if (key_caches.empty()) {
    detail::check_block_mapping(block_mapping, "block_mapping", 0, 0);
    PAGEDKV_CHECK(block_mapping.size(0) == 0, "block_mapping is not empty but there are no caches");
    return;
  }
  const TensorView& k0 = key_caches[0];
  const TensorView& v0 = value_caches[0];
  auto check_layer = [](const TensorView& c, const TensorView& first, const std::string& arg) {
    detail::check_devices({{&first, "key_caches[0]"}, {&c, arg}});
    check_dtype(c, arg, {first.dtype()});
    PAGEDKV_CHECK(c.ndim() >= 2 && c.shape_str() == first.shape_str(), arg, " has shape ",
                  c.shape_str(), " but layer 0 has ", first.shape_str(), " (rank >= 2)");
    // Blocks are copied as flat byte ranges: everything after the block dim is contiguous.
    PAGEDKV_CHECK(detail::block_contiguous(c), arg, " must be contiguous except along num_blocks");
    detail::check_no_self_overlap(c, arg);  // an expanded view: every block is one block
  };
  for (size_t i = 0; i < key_caches.size(); ++i) {
    check_layer(key_caches[i], k0, ::pagedkv::detail::concat("key_caches[", i, "]"));
    check_layer(value_caches[i], v0, ::pagedkv::detail::concat("value_caches[", i, "]"));
  }
  detail::check_devices(
      {{&k0, "key_caches[0]"}, {&v0, "value_caches[0]"}, {&block_mapping, "block_mapping"}});
  const int64_t nb = std::min(k0.size(0), v0.size(0));
  detail::check_block_mapping(block_mapping, "block_mapping", nb, nb);
  if (no_work(k0, block_mapping.size(0))) return;
  PAGEDKV_DISPATCH(k0, copy_blocks, (key_caches, value_caches, block_mapping),
                   (key_caches, value_caches, block_mapping, stream));
  (void)stream;
}

void swap_blocks(const TensorView& src, const TensorView& dst, const TensorView& block_mapping,
                 Stream stream) {
  // src and dst may be on different devices: only their data is checked here.
  detail::check_data({{&src, "src"}, {&dst, "dst"}, {&block_mapping, "block_mapping"}});
  PAGEDKV_CHECK(src.ndim() >= 1 && src.ndim() == dst.ndim(), "src has shape ", src.shape_str(),
                " but dst has shape ", dst.shape_str());
  check_dtype(dst, "dst", {src.dtype()});
  for (int d = 1; d < src.ndim(); ++d)
    PAGEDKV_CHECK(src.size(d) == dst.size(d), "src has shape ", src.shape_str(),
                  " but dst has shape ", dst.shape_str(), " (all dims but the first must match)");
  for (const auto& [c, name] : {std::pair{&src, "src"}, {&dst, "dst"}})
    PAGEDKV_CHECK(detail::block_contiguous(*c), name,
                  " must be contiguous except along num_blocks");
  PAGEDKV_CHECK(!block_mapping.device().is_cuda(), "block_mapping must be a CPU array, got ",
                block_mapping.device().str());
  // dst is written block by block: distinct blocks must be distinct memory. (src may be dst:
  // block copies within one cache.)
  detail::check_no_self_overlap(dst, "dst");
  detail::check_no_overlap({&dst, "dst"}, {{&block_mapping, "block_mapping"}});
  detail::check_block_mapping(block_mapping, "block_mapping", src.size(0), dst.size(0));
  if (src.device().is_cuda() || dst.device().is_cuda()) {
    PAGEDKV_CHECK(
        !(src.device().is_cuda() && dst.device().is_cuda()) || src.device() == dst.device(),
        "src is on ", src.device().str(), " but dst is on ", dst.device().str());
#ifdef PAGEDKV_WITH_CUDA
    cuda_ops::swap_blocks(src, dst, block_mapping, stream);
    return;
#else
    PAGEDKV_CHECK(false,
                  "swap_blocks: src/dst on a CUDA device but pagedkv was built without CUDA");
#endif
  }
  cpu_ops::swap_blocks(src, dst, block_mapping);
  (void)stream;
}

void set_decode_timeline_file(std::string_view path) {
#ifdef PAGEDKV_WITH_CUDA
  PAGEDKV_CHECK(cuda_ops::set_decode_timeline_file(path),
                "set_decode_timeline_file: this build has no decode timeline (CMake option "
                "PAGEDKV_DECODE_TIMELINE=ON)");
#else
  (void)path;
  throw ValueError("set_decode_timeline_file: pagedkv was built without CUDA (no decode timeline)");
#endif
}

}  // namespace ops
}  // namespace pagedkv
