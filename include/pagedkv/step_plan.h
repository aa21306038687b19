// StepPlan: what one engine step runs, as flat metadata (docs/metadata.md: every array's shape,
// dtype, meaning and padding, and what the engine must do with a plan).
//
// Batch order: prefill entries first, then decode entries. Buffers are preallocated once with
// their maximum size; only the first num_tokens / num_seqs elements of this step are valid, and
// they stay valid until the next Scheduler::schedule().
//
// Before running the model, the engine must apply, in this order: blocks_to_swap_out (device ->
// host), blocks_to_swap_in (host -> device), blocks_to_copy (device -> device, copy-on-write).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

namespace pagedkv {

// Value written into block_tables past a sequence's last block. Block 0 is a real block; the
// padding is never read because the attention ops stop at seq_lens.
inline constexpr int32_t kBlockTablePad = 0;

using BlockPairs = std::vector<std::pair<int64_t, int64_t>>;  // [k, 2] int64 when flattened

class Scheduler;

struct StepPlan {
  uint64_t step = 0;                     // increases with every schedule(); update() checks it
  const Scheduler* scheduler = nullptr;  // the scheduler that owns this plan

  int32_t num_seqs = 0;
  int32_t num_prefills = 0;
  int32_t num_prefill_tokens = 0;
  int32_t num_decode_tokens = 0;
  int32_t num_tokens = 0;  // num_prefill_tokens + num_decode_tokens
  int32_t max_query_len = 0;
  int32_t max_prefill_seq_len = 0;     // 0 when there is no prefill
  int32_t max_decode_seq_len = 0;      // 0 when there is no decode
  int32_t max_blocks_per_seq = 0;      // row width of block_tables
  int32_t num_draft_tokens_total = 0;  // sum of num_draft_tokens (0: no speculation this step)

  // The arrays are allocated once for the batch limits (max_num_batched_tokens, max_num_seqs)
  // and reused by every step, so a step allocates nothing: only their first num_tokens /
  // num_seqs (+ 1) entries belong to this step, the rest are stale. The bracketed shapes below
  // are those valid prefixes.
  std::vector<int32_t> input_ids;        // [num_tokens] token ids, prefill chunks first
  std::vector<int64_t> positions;        // [num_tokens] position of each fed token
  std::vector<int64_t> slot_mapping;     // [num_tokens] block_id * block_size + offset
  std::vector<int32_t> seq_lens;         // [num_seqs] context + query
  std::vector<int32_t> context_lens;     // [num_seqs] tokens already cached before this step
  std::vector<int32_t> query_start_loc;  // [num_seqs + 1] prefix sums of query lengths
  std::vector<int32_t> seq_start_loc;    // [num_seqs + 1] prefix sums of seq_lens
  std::vector<int32_t> sample_indices;   // [num_seqs] token index to sample, -1 = partial chunk
  std::vector<int32_t> slots;  // [num_seqs] request slot (Scheduler::request_id), -1 = aborted
  // [num_seqs] draft tokens fed by entry i after its last sampled token (speculative decoding:
  // such an entry is laid out with the prefills and its query is 1 + num_draft_tokens[i] long).
  std::vector<int32_t> num_draft_tokens;
  // [max_num_seqs, max_blocks_per_seq] row-major, padded with kBlockTablePad. calloc'ed so
  // rows never used cost no memory.
  std::unique_ptr<int32_t[], decltype(&std::free)> block_tables{nullptr, &std::free};

  BlockPairs blocks_to_swap_out;         // [k, 2] (device block, host block)
  BlockPairs blocks_to_swap_in;          // [k, 2] (host block, device block)
  BlockPairs blocks_to_copy;             // [k, 2] (src device block, dst device block)
  std::vector<int32_t> preempted_slots;  // recompute-preempted this step (still alive, waiting)

  const int32_t* block_table_row(int32_t i) const {
    return block_tables.get() + static_cast<int64_t>(i) * max_blocks_per_seq;
  }
};

}  // namespace pagedkv
