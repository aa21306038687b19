// Paged KV-cache operations — the vLLM-named kernels (layouts and dtypes: docs/layouts.md).
//
// Every function validates its arguments (shapes, dtypes, devices, ids in range) and throws
// pagedkv::ValueError / TypeError naming the offending argument, then dispatches on the device
// of its first array: CPU kernels (src/ops/cpu) or CUDA kernels (src/ops/cuda, when built).
// Checks that read array *values* (block ids of the used block-table rows, seq_lens against
// the table and max_seq_len, slots, query_start_loc, block mappings) run for host arrays only:
// on the GPU they would need a device synchronisation, so CUDA callers get shape / dtype /
// device checks and must pass consistent metadata. On CUDA, seq_lens, query_start_loc,
// slot_mapping and alibi_slopes must be contiguous and block-table rows unit-stride (the kernels
// read them densely; host arrays may have any strides). An array an op writes (out, v2's
// partials, the caches of the cache writes, dst) must not repeat its own elements (an expanded /
// stride-0 view) nor share memory with an array the op reads (no in-place use): ValueError
// naming both. Head sizes must be kSupportedHeadSizes;
// the vLLM layout needs head_size % x == 0 (fp8 with head size 120 needs the NHD layout).
// sliding_window <= 0 means off; logit = soft_cap * tanh(scale q.k / soft_cap) (cap > 0), then
// + alibi_slope * (key_pos - query_pos).
// CUDA work is enqueued on `stream` and never synchronises or allocates, so it is CUDA-graph safe;
// `stream` must belong to the arrays' GPU (nullptr: that GPU's legacy default stream), or the
// call raises ValueError.
//
// KV-cache layouts, told apart by the key cache's rank:
//   vLLM (rank 5): key_cache   [num_blocks, num_kv_heads, head_size / x, block_size, x]
//                  value_cache [num_blocks, num_kv_heads, head_size, block_size]
//                  x = 16 / element_size(cache dtype)
//   NHD  (rank 4): key_cache = value_cache = [num_blocks, block_size, num_kv_heads, head_size]
// Cache dtype: the query dtype (kv_cache_dtype "auto"), or uint8 holding fp8 e4m3 / e5m2 values
// scaled by k_scale / v_scale (stored = value / scale; read = stored * scale). A scale is a number
// or a 1-element float32 array on the op's device, read by the kernels themselves (Scale).
// Block tables are int32 [num_seqs, max_blocks_per_seq]; entries past a sequence's last block are
// never read (any value, conventionally 0, pads them). Slots are int64
// block_id * block_size + offset; a negative slot marks a padding token and is skipped.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "pagedkv/tensor.h"

namespace pagedkv {

enum class KVCacheDType : uint8_t { kAuto, kFp8E4M3, kFp8E5M2 };

// The kv_cache_dtype names, in the order vLLM lists them ("fp8" = "fp8_e4m3"); the one list every
// layer reads (the bindings export it as pagedkv.ops.KV_CACHE_DTYPES).
inline constexpr std::string_view kKVCacheDTypeNames[] = {"auto", "fp8", "fp8_e4m3", "fp8_e5m2"};

// One of kKVCacheDTypeNames; throws ValueError naming kv_cache_dtype.
KVCacheDType parse_kv_cache_dtype(std::string_view name);

enum class KVLayout : uint8_t { kVLLM, kNHD };

// Partition length of paged_attention_v2 (vLLM's _PARTITION_SIZE): the CPU's split and the
// default partition_size (pagedkv.ops.PARTITION_SIZE).
inline constexpr int kPartitionSize = 512;

// Head sizes every attention op supports (pagedkv.ops.SUPPORTED_HEAD_SIZES).
inline constexpr int kSupportedHeadSizes[] = {32, 64, 80, 96, 112, 120, 128, 192, 256};
bool is_supported_head_size(int head_size);

// The kernels an attention call can run on (docs/kernels.md). On a GPU each op has three:
//   decode (paged_attention_v1 / v2): kHopper = the bulk-copy decode (sm_90; fp16 / bf16 queries,
//     head sizes multiples of 16, row (NHD) caches), kTensorCore = the mma.sync decode (fp16 /
//     bf16 queries, both layouts), kCudaCore = the scalar kernel (everything);
//   prefill (context_attention_fwd): kHopper = the wgmma kernel (sm_90a; fp16 / bf16, head sizes
//     64 and 128, NHD caches), kTensorCore = the mma.sync kernel (fp16 / bf16), kCudaCore.
// kAuto (the default) runs the first that covers the call; naming one makes it required: a call
// it does not cover raises ValueError saying why (tests prove which kernel ran, benchmarks compare
// them). kCpu is the one kernel for host arrays.
enum class AttentionKernel : uint8_t { kAuto, kCpu, kHopper, kTensorCore, kCudaCore };

// The kernel names (pagedkv.ops.ATTENTION_KERNELS), indexed by AttentionKernel.
inline constexpr std::string_view kAttentionKernelNames[] = {"auto", "cpu", "hopper", "tensor_core",
                                                             "cuda_core"};

// One of kAttentionKernelNames; throws ValueError naming `kernel`.
AttentionKernel parse_attention_kernel(std::string_view name);
std::string_view attention_kernel_name(AttentionKernel kernel);

// An fp8 dequantisation scale: a number, or a 1-element float32 array on the op's device (vLLM
// passes tensors) that the kernels read on that device: no host synchronisation, and a captured
// CUDA graph reads the value current at each replay. Host arrays are checked like numbers
// (positive, finite, finite reciprocal); device arrays cannot be read without a synchronisation,
// so their value is the caller's responsibility. Ignored (neither read nor checked beyond its
// dtype, size and device) by "auto" caches.
struct Scale {
  float value = 1.0f;
  std::optional<TensorView> array;  // when set, the scale (value unused)

  Scale(float v = 1.0f) : value(v) {}       // NOLINT(google-explicit-constructor)
  Scale(const TensorView& a) : array(a) {}  // NOLINT(google-explicit-constructor)
};

// Options shared by the attention ops. Defaults mean "off".
struct AttentionOptions {
  float scale = 1.0f;                      // softmax scale, usually 1/sqrt(head_size)
  std::optional<TensorView> alibi_slopes;  // [num_heads] float32
  float logits_soft_cap = 0.0f;            // > 0: logits = cap * tanh(logits / cap)
  int sliding_window = -1;                 // > 0: attend to the last `sliding_window` keys
  // false (encoders, context_attention_fwd only): every query token sees all seq_lens keys of its
  // sequence, later ones included; needs sliding_window off. Decode (one query at the sequence's
  // end) sees the same keys either way.
  bool causal = true;
  KVCacheDType kv_cache_dtype = KVCacheDType::kAuto;
  Scale k_scale;
  Scale v_scale;
  AttentionKernel kernel = AttentionKernel::kAuto;  // kAuto: the first kernel covering the call
};

namespace ops {

// Writes key/value [num_tokens, num_kv_heads, head_size] into a vLLM-layout cache (rank 5).
void reshape_and_cache(const TensorView& key, const TensorView& value, const TensorView& key_cache,
                       const TensorView& value_cache,
                       const TensorView& slot_mapping,  // [num_tokens] int64
                       KVCacheDType kv_cache_dtype, const Scale& k_scale, const Scale& v_scale,
                       Stream stream = nullptr);

// Same for the NHD layout (rank 4).
void reshape_and_cache_flash(const TensorView& key, const TensorView& value,
                             const TensorView& key_cache, const TensorView& value_cache,
                             const TensorView& slot_mapping, KVCacheDType kv_cache_dtype,
                             const Scale& k_scale, const Scale& v_scale, Stream stream = nullptr);

// Decode attention, one query token per sequence, single pass over the context.
//   out, query: [num_seqs, num_heads, head_size]; seq_lens: [num_seqs] int32
void paged_attention_v1(const TensorView& out, const TensorView& query, const TensorView& key_cache,
                        const TensorView& value_cache, int num_kv_heads,
                        const TensorView& block_tables, const TensorView& seq_lens, int max_seq_len,
                        const AttentionOptions& opts, Stream stream = nullptr);

// Decode attention split over partitions of `partition_size` keys, then reduced.
//   exp_sums, max_logits: [num_seqs, num_heads, max_num_partitions] float32
//   tmp_out: [num_seqs, num_heads, max_num_partitions, head_size] (float32 recommended: the
//   partial outputs are merged in fp32; the query dtype is accepted for vLLM compatibility)
void paged_attention_v2(const TensorView& out, const TensorView& exp_sums,
                        const TensorView& max_logits, const TensorView& tmp_out,
                        const TensorView& query, const TensorView& key_cache,
                        const TensorView& value_cache, int num_kv_heads,
                        const TensorView& block_tables, const TensorView& seq_lens, int max_seq_len,
                        const AttentionOptions& opts, int partition_size = kPartitionSize,
                        Stream stream = nullptr);

// Work-balanced decode: the work items of a plan (pagedkv/decode_plan.h, from
// plan_balanced_decode) each attend one sequence's keys [key_lo, key_hi) and write a partial
// result to their row of the workspace; a reduction merges each sequence's rows (seq_offsets) in
// fp32. The grid covers every item of the plan's capacity (fixed by the arrays' shapes, so a
// captured CUDA graph stays valid while the engine refills the plan each step); unused items run
// nothing. A sequence without items gets a zero output.
//   work_items: [capacity, 4] int32 (CUDA: 16-byte aligned); seq_offsets: [num_seqs + 1] int32
//   (both on the op's device)
//   exp_sums, max_logits: [capacity, num_heads] float32; tmp_out: [capacity, num_heads,
//   head_size] float32
// Kernels: "cpu" on the host; on a GPU the Hopper decode only ("hopper", which "auto" means here):
// another named kernel, or a call the Hopper decode does not cover, raises ValueError. A host plan
// is checked against seq_lens (each sequence's items cover its visible keys in order); a device
// plan cannot be read without a synchronisation: its keys are clamped to the sequence, and items
// naming no sequence of the call run nothing.
// lse (optional, [num_heads, num_seqs] float32): each output row's log-sum-exp of its logits
// (natural log; -inf without keys), for merge_attn_states (cascade attention).
void paged_attention_balanced(const TensorView& out, const TensorView& exp_sums,
                              const TensorView& max_logits, const TensorView& tmp_out,
                              const TensorView& query, const TensorView& key_cache,
                              const TensorView& value_cache, int num_kv_heads,
                              const TensorView& block_tables, const TensorView& seq_lens,
                              const TensorView& work_items, const TensorView& seq_offsets,
                              int max_seq_len, const AttentionOptions& opts,
                              const std::optional<TensorView>& lse = std::nullopt,
                              Stream stream = nullptr);

// Merges two attention results of the same queries over disjoint key sets (cascade attention: a
// shared prefix and each sequence's own suffix) by their log-sum-exps, as vLLM's
// merge_attn_states: with m = max(lp, ls), wp = exp(lp - m), ws = exp(ls - m),
//   output[t, h] = (wp * prefix_output[t, h] + ws * suffix_output[t, h]) / (wp + ws)
//   output_lse[h, t] = m + log(wp + ws)
// A -inf log-sum-exp (no key) weighs 0 (+inf is read as -inf, as vLLM does); both -inf give a
// zero output and -inf; a NaN propagates.
//   output, prefix_output, suffix_output: [num_tokens, num_heads, head_size], one float dtype,
//   rows contiguous in head_size; prefix_lse, suffix_lse, output_lse (optional): [num_heads,
//   num_tokens] float32.
void merge_attn_states(const TensorView& output, const std::optional<TensorView>& output_lse,
                       const TensorView& prefix_output, const TensorView& prefix_lse,
                       const TensorView& suffix_output, const TensorView& suffix_lse,
                       Stream stream = nullptr);

// The planner over arrays: seq_lens [num_seqs], work_items [capacity, 4] and seq_offsets
// [num_seqs + 1], int32 host arrays (contiguous outputs). Returns the items used.
int plan_balanced_decode(const TensorView& seq_lens, const TensorView& work_items,
                         const TensorView& seq_offsets, int target_items, int sliding_window,
                         int min_chunk);

// The planner's target_items for a balanced decode call on its device: the work items that run
// at once (on a GPU, the Hopper decode's resident CTAs over the CTAs of one item: KV heads x head
// chunks; on the CPU, four per thread over the KV heads). `kernel` as paged_attention_balanced's.
int balanced_decode_target(const TensorView& query, const TensorView& key_cache,
                           const TensorView& value_cache, int num_kv_heads,
                           KVCacheDType kv_cache_dtype,
                           AttentionKernel kernel = AttentionKernel::kAuto);

// The kernel paged_attention_v1 / v2 run for this query and these caches on their device under
// the choice `kernel` (AttentionKernel): never kAuto; ValueError when a named kernel does not
// cover the call or does not run on the arrays' device.
//   query: [num_seqs, num_heads, head_size]; caches as for paged_attention_v1
AttentionKernel decode_kernel(const TensorView& query, const TensorView& key_cache,
                              const TensorView& value_cache, int num_kv_heads,
                              KVCacheDType kv_cache_dtype,
                              AttentionKernel kernel = AttentionKernel::kAuto);

// The split-K choice: the partition (keys) for paged_attention_v2, or 0 where the single pass
// (paged_attention_v1) is better. On a GPU every kernel runs one CTA per (sequence, KV head,
// query-head chunk, partition), and a grid that leaves the GPU under-filled is cut into
// slots / CTAs partitions (multiples of 16 keys and of block_size, at least 128 keys):
//  - the Hopper kernel streams a 16-bit cache at full bandwidth from one CTA per SM, so it
//    splits only to reach that; an fp8 cache (half the bytes per key for the same math) wants
//    every CTA slot filled (4 per SM), in partitions of at least 256 keys, where that at least
//    triples the CTAs (two partitions lose to the unsplit grid);
//  - the tensor-core kernel (up to 16 query heads per CTA): 2 CTAs per SM, 4 with fp8;
//  - the CUDA-core kernel (8 query heads per CTA) is issue-bound and wants ~8 CTAs per SM.
// Each within 2 % of the best fixed size on the H100 benchmark shapes (benchmarks/RESULTS.md).
// On the CPU, vLLM's rule: kPartitionSize-key partitions (rounded up to whole blocks) when the
// context spans several and the batch is small (num_seqs * num_heads <= 512), or past 8192 keys.
int decode_partition_size(AttentionKernel kernel, int num_seqs, int num_heads, int num_kv_heads,
                          int max_seq_len, int block_size, int num_sms,
                          KVCacheDType kv_cache_dtype);

// The same for a call: decode_kernel's kernel (under the choice `kernel`) and the query's GPU
// (its multiprocessors).
int decode_partition_size(const TensorView& query, const TensorView& key_cache,
                          const TensorView& value_cache, int num_kv_heads, int max_seq_len,
                          KVCacheDType kv_cache_dtype,
                          AttentionKernel kernel = AttentionKernel::kAuto);

// Prefill / extend attention (chunked prefill, prefix reuse): the query tokens of each sequence
// attend causally to the sequence's cached context (from the paged cache) and to themselves; with
// opts.causal false (encoders) every query token attends to all of the sequence's keys.
//   query, out: [num_tokens, num_heads, head_size]
//   key, value: [num_tokens, num_kv_heads, head_size] of the new tokens (already written to the
//               cache or not: the kernel reads the new tokens from here, the context from cache)
//   query_start_loc: [num_seqs + 1] int32; seq_lens: [num_seqs] int32 (context + query)
//   context_len of sequence i = seq_lens[i] - (query_start_loc[i+1] - query_start_loc[i])
void context_attention_fwd(const TensorView& out, const TensorView& query, const TensorView& key,
                           const TensorView& value, const TensorView& key_cache,
                           const TensorView& value_cache, const TensorView& block_tables,
                           const TensorView& query_start_loc, const TensorView& seq_lens,
                           int max_query_len, const AttentionOptions& opts,
                           Stream stream = nullptr);

// Copies whole blocks within each layer's caches: block_mapping [n, 2] int64 (src, dst).
// On the CPU and with a host block_mapping on CUDA the pairs run in order (a chain a -> b,
// b -> c copies like a sequential loop); a CUDA block_mapping (whose values the host cannot
// check without a sync) runs them in parallel, so its pairs must be independent: no block that
// is both a destination and another pair's source, no destination twice (the scheduler's
// copy-on-write pairs always are: each destination is a freshly allocated block).
void copy_blocks(const std::vector<TensorView>& key_caches,
                 const std::vector<TensorView>& value_caches, const TensorView& block_mapping,
                 Stream stream = nullptr);

// Copies blocks between two caches, possibly on different devices (GPU <-> pinned host):
// block_mapping [n, 2] int64 (src block in `src`, dst block in `dst`), on the CPU.
void swap_blocks(const TensorView& src, const TensorView& dst, const TensorView& block_mapping,
                 Stream stream = nullptr);

// Profiling builds (CMake option PAGEDKV_DECODE_TIMELINE) only: the file each Hopper decode call
// appends its CTAs' timer stamps to, synchronising its stream ("" stops; read by
// benchmarks/decode_timeline.py). Other builds raise ValueError.
void set_decode_timeline_file(std::string_view path);

}  // namespace ops
}  // namespace pagedkv
