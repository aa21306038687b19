// SchedulerConfig: the knobs of the continuous-batching scheduler (vLLM's names and defaults).
#pragma once

#include <cstdint>

namespace pagedkv {

enum class PreemptionMode : uint8_t {
  kRecompute,  // free the victim's blocks; it re-prefills prompt + generated tokens later
  kSwap,       // move the victim's blocks to the host pool; swap them back in later
};

enum class SchedulingPolicy : uint8_t {
  kFcfs,      // first come, first served
  kPriority,  // lower `priority` value first (vLLM convention), then arrival order
};

struct SchedulerConfig {
  int32_t num_blocks = 0;                 // device KV-cache blocks
  int32_t block_size = 16;                // tokens per block
  int32_t max_num_seqs = 256;             // sequences per step
  int32_t max_num_batched_tokens = 2048;  // tokens per step (the token budget)
  bool enable_chunked_prefill = true;     // split long prompts across steps
  bool enable_prefix_caching = true;      // reuse cached full blocks of equal prefixes
  int32_t num_cpu_blocks = 0;             // host swap pool (needed by PreemptionMode::kSwap)
  PreemptionMode preemption_mode = PreemptionMode::kRecompute;
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  // Longest prompt + output. 0 = num_blocks * block_size; clamped to max_num_batched_tokens
  // when chunked prefill is off (a prompt must then fit one step).
  int32_t max_model_len = 0;

  // Throws ValueError naming the offending field.
  void validate() const;
  // max_model_len with the default applied.
  int32_t effective_max_model_len() const;
  // Row width of StepPlan::block_tables: ceil(max_model_len / block_size).
  int32_t max_blocks_per_seq() const;
};

}  // namespace pagedkv
