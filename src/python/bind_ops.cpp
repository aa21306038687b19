// Python bindings of the paged KV-cache ops (pagedkv._C.ops_*). Arrays arrive as InArray (read
// only by the op: read-only arrays welcome) or OutArray (written: must be writable), from any
// DLPack / buffer-protocol object, never converted or copied (caches are written in place), and
// are viewed as TensorViews named after the argument for error messages (tensor_caster.h). The GIL
// is released while the kernels run. The Python layer (pagedkv/ops.py) adds vLLM's argument order,
// scalar scale handling and the caller's CUDA stream.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/cpu/parallel.h"
#include "pagedkv/decode_plan.h"
#include "pagedkv/ops.h"
#include "python/bindings.h"
#include "python/tensor_caster.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace pagedkv::python {
namespace {

// A Scale from the Python layer's pair: the number, or the array when one is given.
Scale make_scale(float value, const std::optional<InArray>& array, const char* name) {
  if (array) return Scale(to_view(*array, name));
  return Scale(value);
}

AttentionOptions make_options(float scale, const std::optional<InArray>& alibi_slopes,
                              float logits_soft_cap, int sliding_window,
                              const std::string& kv_cache_dtype, const Scale& k_scale,
                              const Scale& v_scale, const std::string& kernel) {
  AttentionOptions o;
  o.scale = scale;
  o.alibi_slopes = to_view(alibi_slopes, "alibi_slopes");
  o.logits_soft_cap = logits_soft_cap;
  o.sliding_window = sliding_window;
  o.kv_cache_dtype = parse_kv_cache_dtype(kv_cache_dtype);
  o.k_scale = k_scale;
  o.v_scale = v_scale;
  o.kernel = parse_attention_kernel(kernel);
  return o;
}

std::vector<TensorView> to_views(const std::vector<OutArray>& arrays, const char* name) {
  std::vector<TensorView> views;
  views.reserve(arrays.size());
  for (size_t i = 0; i < arrays.size(); ++i)
    views.push_back(to_view(arrays[i], std::string(name) + "[" + std::to_string(i) + "]"));
  return views;
}

// A C++ list as a Python tuple (the shared vocabularies of include/pagedkv/ops.h).
template <typename T, size_t N>
nb::tuple as_tuple(const T (&items)[N]) {
  nb::list l;
  for (const T& item : items) {
    if constexpr (std::is_same_v<T, std::string_view>) {
      l.append(nb::str(item.data(), item.size()));
    } else {
      l.append(item);
    }
  }
  return nb::tuple(l);
}

}  // namespace

void bind_ops(nb::module_& m) {
  // The shared vocabularies, defined once in include/pagedkv/ops.h (pagedkv.ops re-exports them).
  m.attr("KV_CACHE_DTYPES") = as_tuple(kKVCacheDTypeNames);
  m.attr("ATTENTION_KERNELS") = as_tuple(kAttentionKernelNames);
  m.attr("SUPPORTED_HEAD_SIZES") = as_tuple(kSupportedHeadSizes);
  m.attr("PARTITION_SIZE") = kPartitionSize;
  m.attr("BALANCED_MIN_CHUNK") = kBalancedMinChunk;
  m.attr("BALANCED_ITEM_INTS") = kBalancedItemInts;

  m.def(
      "ops_reshape_and_cache",
      [](InArray key, InArray value, OutArray key_cache, OutArray value_cache, InArray slot_mapping,
         const std::string& kv_cache_dtype, float k_scale, float v_scale, bool flash,
         uintptr_t stream, std::optional<InArray> k_scale_array,
         std::optional<InArray> v_scale_array) {
        const TensorView k = to_view(key, "key"), v = to_view(value, "value");
        const TensorView kc = to_view(key_cache, "key_cache");
        const TensorView vc = to_view(value_cache, "value_cache");
        const TensorView sm = to_view(slot_mapping, "slot_mapping");
        const KVCacheDType dt = parse_kv_cache_dtype(kv_cache_dtype);
        const Scale ks = make_scale(k_scale, k_scale_array, "k_scale");
        const Scale vs = make_scale(v_scale, v_scale_array, "v_scale");
        nb::gil_scoped_release release;
        if (flash) {
          ops::reshape_and_cache_flash(k, v, kc, vc, sm, dt, ks, vs, to_stream(stream));
        } else {
          ops::reshape_and_cache(k, v, kc, vc, sm, dt, ks, vs, to_stream(stream));
        }
      },
      "key"_a, "value"_a, "key_cache"_a.noconvert(), "value_cache"_a.noconvert(), "slot_mapping"_a,
      "kv_cache_dtype"_a, "k_scale"_a, "v_scale"_a, "flash"_a, "stream"_a = 0,
      "k_scale_array"_a.none() = nb::none(), "v_scale_array"_a.none() = nb::none(),
      "Writes key/value [num_tokens, num_kv_heads, head_size] into the paged caches at "
      "slot_mapping (vLLM layout, or NHD when flash=True).");

  m.def(
      "ops_paged_attention_v1",
      [](OutArray out, InArray query, InArray key_cache, InArray value_cache, int num_kv_heads,
         float scale, InArray block_tables, InArray seq_lens, int max_seq_len,
         std::optional<InArray> alibi_slopes, const std::string& kv_cache_dtype, float k_scale,
         float v_scale, float logits_soft_cap, int sliding_window, uintptr_t stream,
         const std::string& kernel, std::optional<InArray> k_scale_array,
         std::optional<InArray> v_scale_array) {
        const AttentionOptions o =
            make_options(scale, alibi_slopes, logits_soft_cap, sliding_window, kv_cache_dtype,
                         make_scale(k_scale, k_scale_array, "k_scale"),
                         make_scale(v_scale, v_scale_array, "v_scale"), kernel);
        const TensorView vo = to_view(out, "out"), vq = to_view(query, "query");
        const TensorView kc = to_view(key_cache, "key_cache");
        const TensorView vc = to_view(value_cache, "value_cache");
        const TensorView bt = to_view(block_tables, "block_tables");
        const TensorView sl = to_view(seq_lens, "seq_lens");
        nb::gil_scoped_release release;
        ops::paged_attention_v1(vo, vq, kc, vc, num_kv_heads, bt, sl, max_seq_len, o,
                                to_stream(stream));
      },
      "out"_a.noconvert(), "query"_a, "key_cache"_a.noconvert(), "value_cache"_a.noconvert(),
      "num_kv_heads"_a, "scale"_a, "block_tables"_a, "seq_lens"_a, "max_seq_len"_a,
      "alibi_slopes"_a.none(), "kv_cache_dtype"_a, "k_scale"_a, "v_scale"_a,
      "logits_soft_cap"_a = 0.0f, "sliding_window"_a = -1, "stream"_a = 0, "kernel"_a = "auto",
      "k_scale_array"_a.none() = nb::none(), "v_scale_array"_a.none() = nb::none(),
      "Decode attention over a paged KV cache, single pass; writes `out`.");

  m.def(
      "ops_paged_attention_v2",
      [](OutArray out, OutArray exp_sums, OutArray max_logits, OutArray tmp_out, InArray query,
         InArray key_cache, InArray value_cache, int num_kv_heads, float scale,
         InArray block_tables, InArray seq_lens, int max_seq_len,
         std::optional<InArray> alibi_slopes, const std::string& kv_cache_dtype, float k_scale,
         float v_scale, float logits_soft_cap, int sliding_window, int partition_size,
         uintptr_t stream, const std::string& kernel, std::optional<InArray> k_scale_array,
         std::optional<InArray> v_scale_array) {
        const AttentionOptions o =
            make_options(scale, alibi_slopes, logits_soft_cap, sliding_window, kv_cache_dtype,
                         make_scale(k_scale, k_scale_array, "k_scale"),
                         make_scale(v_scale, v_scale_array, "v_scale"), kernel);
        const TensorView vo = to_view(out, "out"), vq = to_view(query, "query");
        const TensorView es = to_view(exp_sums, "exp_sums");
        const TensorView ml = to_view(max_logits, "max_logits");
        const TensorView to = to_view(tmp_out, "tmp_out");
        const TensorView kc = to_view(key_cache, "key_cache");
        const TensorView vc = to_view(value_cache, "value_cache");
        const TensorView bt = to_view(block_tables, "block_tables");
        const TensorView sl = to_view(seq_lens, "seq_lens");
        nb::gil_scoped_release release;
        ops::paged_attention_v2(vo, es, ml, to, vq, kc, vc, num_kv_heads, bt, sl, max_seq_len, o,
                                partition_size, to_stream(stream));
      },
      "out"_a.noconvert(), "exp_sums"_a.noconvert(), "max_logits"_a.noconvert(),
      "tmp_out"_a.noconvert(), "query"_a, "key_cache"_a.noconvert(), "value_cache"_a.noconvert(),
      "num_kv_heads"_a, "scale"_a, "block_tables"_a, "seq_lens"_a, "max_seq_len"_a,
      "alibi_slopes"_a.none(), "kv_cache_dtype"_a, "k_scale"_a, "v_scale"_a,
      "logits_soft_cap"_a = 0.0f, "sliding_window"_a = -1, "partition_size"_a = kPartitionSize,
      "stream"_a = 0, "kernel"_a = "auto", "k_scale_array"_a.none() = nb::none(),
      "v_scale_array"_a.none() = nb::none(),
      "Decode attention split into partitions (exp_sums / max_logits / tmp_out), then merged.");

  m.def(
      "ops_paged_attention_balanced",
      [](OutArray out, OutArray exp_sums, OutArray max_logits, OutArray tmp_out, InArray query,
         InArray key_cache, InArray value_cache, int num_kv_heads, float scale,
         InArray block_tables, InArray seq_lens, InArray work_items, InArray seq_offsets,
         int max_seq_len, std::optional<InArray> alibi_slopes, const std::string& kv_cache_dtype,
         float k_scale, float v_scale, float logits_soft_cap, int sliding_window, uintptr_t stream,
         const std::string& kernel, std::optional<InArray> k_scale_array,
         std::optional<InArray> v_scale_array, std::optional<OutArray> lse) {
        const AttentionOptions o =
            make_options(scale, alibi_slopes, logits_soft_cap, sliding_window, kv_cache_dtype,
                         make_scale(k_scale, k_scale_array, "k_scale"),
                         make_scale(v_scale, v_scale_array, "v_scale"), kernel);
        const TensorView vo = to_view(out, "out"), vq = to_view(query, "query");
        const TensorView es = to_view(exp_sums, "exp_sums");
        const TensorView ml = to_view(max_logits, "max_logits");
        const TensorView to = to_view(tmp_out, "tmp_out");
        const TensorView kc = to_view(key_cache, "key_cache");
        const TensorView vc = to_view(value_cache, "value_cache");
        const TensorView bt = to_view(block_tables, "block_tables");
        const TensorView sl = to_view(seq_lens, "seq_lens");
        const TensorView wi = to_view(work_items, "work_items");
        const TensorView so = to_view(seq_offsets, "seq_offsets");
        std::optional<TensorView> vl;
        if (lse) vl = to_view(*lse, "lse");
        nb::gil_scoped_release release;
        ops::paged_attention_balanced(vo, es, ml, to, vq, kc, vc, num_kv_heads, bt, sl, wi, so,
                                      max_seq_len, o, vl, to_stream(stream));
      },
      "out"_a.noconvert(), "exp_sums"_a.noconvert(), "max_logits"_a.noconvert(),
      "tmp_out"_a.noconvert(), "query"_a, "key_cache"_a.noconvert(), "value_cache"_a.noconvert(),
      "num_kv_heads"_a, "scale"_a, "block_tables"_a, "seq_lens"_a, "work_items"_a, "seq_offsets"_a,
      "max_seq_len"_a, "alibi_slopes"_a.none(), "kv_cache_dtype"_a, "k_scale"_a, "v_scale"_a,
      "logits_soft_cap"_a = 0.0f, "sliding_window"_a = -1, "stream"_a = 0, "kernel"_a = "auto",
      "k_scale_array"_a.none() = nb::none(), "v_scale_array"_a.none() = nb::none(),
      "lse"_a.noconvert().none() = nb::none(),
      "Work-balanced decode attention over a plan (ops_plan_balanced_decode): each work item's "
      "partial into its workspace row, then each sequence's rows merged into `out` (and their "
      "log-sum-exps into `lse` [num_heads, num_seqs] when given).");

  m.def(
      "ops_merge_attn_states",
      [](OutArray output, InArray prefix_output, InArray prefix_lse, InArray suffix_output,
         InArray suffix_lse, std::optional<OutArray> output_lse, uintptr_t stream) {
        const TensorView o = to_view(output, "output");
        const TensorView po = to_view(prefix_output, "prefix_output");
        const TensorView pl = to_view(prefix_lse, "prefix_lse");
        const TensorView so = to_view(suffix_output, "suffix_output");
        const TensorView sl = to_view(suffix_lse, "suffix_lse");
        std::optional<TensorView> ol;
        if (output_lse) ol = to_view(*output_lse, "output_lse");
        nb::gil_scoped_release release;
        ops::merge_attn_states(o, ol, po, pl, so, sl, to_stream(stream));
      },
      "output"_a.noconvert(), "prefix_output"_a, "prefix_lse"_a, "suffix_output"_a, "suffix_lse"_a,
      "output_lse"_a.noconvert().none() = nb::none(), "stream"_a = 0,
      "Merges two attention results over disjoint keys by their log-sum-exps (vLLM "
      "merge_attn_states).");

  m.def(
      "ops_plan_balanced_decode",
      [](InArray seq_lens, OutArray work_items, OutArray seq_offsets, int target_items,
         int sliding_window, int min_chunk) {
        return ops::plan_balanced_decode(
            to_view(seq_lens, "seq_lens"), to_view(work_items, "work_items"),
            to_view(seq_offsets, "seq_offsets"), target_items, sliding_window, min_chunk);
      },
      "seq_lens"_a, "work_items"_a.noconvert(), "seq_offsets"_a.noconvert(), "target_items"_a,
      "sliding_window"_a = -1, "min_chunk"_a = kBalancedMinChunk,
      "Fills a work-balanced decode plan (host int32 arrays) from host seq_lens; returns the "
      "work items used.");

  m.def(
      "ops_balanced_decode_target",
      [](InArray query, InArray key_cache, InArray value_cache, int num_kv_heads,
         const std::string& kv_cache_dtype, const std::string& kernel) {
        return ops::balanced_decode_target(to_view(query, "query"), to_view(key_cache, "key_cache"),
                                           to_view(value_cache, "value_cache"), num_kv_heads,
                                           parse_kv_cache_dtype(kv_cache_dtype),
                                           parse_attention_kernel(kernel));
      },
      "query"_a, "key_cache"_a, "value_cache"_a, "num_kv_heads"_a, "kv_cache_dtype"_a,
      "kernel"_a = "auto",
      "The work items a balanced decode runs at once on this call's device (the planner's "
      "target_items).");

  m.def(
      "ops_context_attention_fwd",
      [](OutArray out, InArray query, InArray key, InArray value, InArray key_cache,
         InArray value_cache, InArray block_tables, InArray query_start_loc, InArray seq_lens,
         int max_query_len, float scale, std::optional<InArray> alibi_slopes,
         const std::string& kv_cache_dtype, float k_scale, float v_scale, float logits_soft_cap,
         int sliding_window, uintptr_t stream, const std::string& kernel,
         std::optional<InArray> k_scale_array, std::optional<InArray> v_scale_array, bool causal) {
        AttentionOptions o =
            make_options(scale, alibi_slopes, logits_soft_cap, sliding_window, kv_cache_dtype,
                         make_scale(k_scale, k_scale_array, "k_scale"),
                         make_scale(v_scale, v_scale_array, "v_scale"), kernel);
        o.causal = causal;
        const TensorView vo = to_view(out, "out"), vq = to_view(query, "query");
        const TensorView vk = to_view(key, "key"), vv = to_view(value, "value");
        const TensorView kc = to_view(key_cache, "key_cache");
        const TensorView vc = to_view(value_cache, "value_cache");
        const TensorView bt = to_view(block_tables, "block_tables");
        const TensorView qs = to_view(query_start_loc, "query_start_loc");
        const TensorView sl = to_view(seq_lens, "seq_lens");
        nb::gil_scoped_release release;
        ops::context_attention_fwd(vo, vq, vk, vv, kc, vc, bt, qs, sl, max_query_len, o,
                                   to_stream(stream));
      },
      "out"_a.noconvert(), "query"_a, "key"_a, "value"_a, "key_cache"_a.noconvert(),
      "value_cache"_a.noconvert(), "block_tables"_a, "query_start_loc"_a, "seq_lens"_a,
      "max_query_len"_a, "scale"_a, "alibi_slopes"_a.none(), "kv_cache_dtype"_a, "k_scale"_a,
      "v_scale"_a, "logits_soft_cap"_a = 0.0f, "sliding_window"_a = -1, "stream"_a = 0,
      "kernel"_a = "auto", "k_scale_array"_a.none() = nb::none(),
      "v_scale_array"_a.none() = nb::none(), "causal"_a = true,
      "Prefill/extend attention: new tokens attend causally to the cached context and "
      "themselves (causal=False: to all of their sequence's keys); writes `out`.");

  m.def(
      "ops_copy_blocks",
      [](std::vector<OutArray> key_caches, std::vector<OutArray> value_caches,
         InArray block_mapping, uintptr_t stream) {
        const std::vector<TensorView> kc = to_views(key_caches, "key_caches");
        const std::vector<TensorView> vc = to_views(value_caches, "value_caches");
        const TensorView bm = to_view(block_mapping, "block_mapping");
        nb::gil_scoped_release release;
        ops::copy_blocks(kc, vc, bm, to_stream(stream));
      },
      "key_caches"_a, "value_caches"_a, "block_mapping"_a, "stream"_a = 0,
      "Copies blocks (src, dst) within every layer's caches.");

  m.def(
      "ops_swap_blocks",
      [](InArray src, OutArray dst, InArray block_mapping, uintptr_t stream) {
        const TensorView s = to_view(src, "src"), d = to_view(dst, "dst");
        const TensorView bm = to_view(block_mapping, "block_mapping");
        nb::gil_scoped_release release;
        ops::swap_blocks(s, d, bm, to_stream(stream));
      },
      "src"_a, "dst"_a.noconvert(), "block_mapping"_a, "stream"_a = 0,
      "Copies blocks from src to dst (host <-> device or host <-> host).");

  m.def(
      "ops_decode_kernel",
      [](InArray query, InArray key_cache, InArray value_cache, int num_kv_heads,
         const std::string& kv_cache_dtype, const std::string& kernel) -> std::string {
        // Views made in argument order, so the first bad argument is the one reported.
        const TensorView q = to_view(query, "query"), kc = to_view(key_cache, "key_cache");
        const TensorView vc = to_view(value_cache, "value_cache");
        return std::string(attention_kernel_name(
            ops::decode_kernel(q, kc, vc, num_kv_heads, parse_kv_cache_dtype(kv_cache_dtype),
                               parse_attention_kernel(kernel))));
      },
      "query"_a, "key_cache"_a, "value_cache"_a, "num_kv_heads"_a, "kv_cache_dtype"_a,
      "kernel"_a = "auto",
      "The decode kernel paged_attention_v1 / v2 run for this call under the choice `kernel`: "
      "'cpu', 'hopper', 'tensor_core' or 'cuda_core'.");

  m.def(
      "ops_decode_partition_size",
      [](InArray query, InArray key_cache, InArray value_cache, int num_kv_heads, int max_seq_len,
         const std::string& kv_cache_dtype, const std::string& kernel) {
        const TensorView q = to_view(query, "query"), kc = to_view(key_cache, "key_cache");
        const TensorView vc = to_view(value_cache, "value_cache");
        return ops::decode_partition_size(q, kc, vc, num_kv_heads, max_seq_len,
                                          parse_kv_cache_dtype(kv_cache_dtype),
                                          parse_attention_kernel(kernel));
      },
      "query"_a, "key_cache"_a, "value_cache"_a, "num_kv_heads"_a, "max_seq_len"_a,
      "kv_cache_dtype"_a, "kernel"_a = "auto",
      "The split-K partition for paged_attention_v2 on this call's kernel and device, or 0 "
      "for the single pass (paged_attention_v1).");

  m.def(
      "ops_decode_partition_rule",
      [](const std::string& kernel, int num_seqs, int num_heads, int num_kv_heads, int max_seq_len,
         int block_size, int num_sms, const std::string& kv_cache_dtype) {
        return ops::decode_partition_size(parse_attention_kernel(kernel), num_seqs, num_heads,
                                          num_kv_heads, max_seq_len, block_size, num_sms,
                                          parse_kv_cache_dtype(kv_cache_dtype));
      },
      "kernel"_a, "num_seqs"_a, "num_heads"_a, "num_kv_heads"_a, "max_seq_len"_a, "block_size"_a,
      "num_sms"_a, "kv_cache_dtype"_a,
      "ops_decode_partition_size's rule for a given kernel and GPU size.");

  m.def("ops_num_threads", &cpu_ops::num_threads,
        "Threads used by the CPU kernels (ops_set_num_threads's count, else the usable CPUs).");
  m.def("ops_set_num_threads", &cpu_ops::set_num_threads, "n"_a,
        "Fixes the CPU kernels' thread count before their first use (ValueError afterwards unless "
        "it is the count in use).");
  m.def(
      "ops_set_decode_timeline_file",
      [](const std::string& path) { ops::set_decode_timeline_file(path); }, "path"_a,
      "Profiling builds (PAGEDKV_DECODE_TIMELINE=ON): the file each Hopper decode call appends "
      "its per-CTA timer stamps to ('' stops); ValueError in other builds.");
}

}  // namespace pagedkv::python
