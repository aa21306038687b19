// Request: the scheduler's per-request state (internal).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "pagedkv/block_allocator.h"
#include "pagedkv/scheduler.h"
#include "token_seq.h"

namespace pagedkv {

// kFinishing: advanced to max_tokens with a placeholder token; freed by the next resolve().
enum class RequestState : uint8_t { kFree, kWaiting, kRunning, kSwapped, kFinishing };

struct Request {
  std::string id;
  int32_t slot = -1;
  int64_t arrival = 0;   // unique, increasing: FCFS order and tie-break of priorities
  int32_t priority = 0;  // scheduling key (0 under FCFS)
  RequestParams params;
  RequestState state = RequestState::kFree;

  TokenSeq tokens;  // prompt (shared with forked children) + generated
  int32_t num_prompt_tokens = 0;
  int32_t num_computed = 0;    // tokens whose KV is in the cache
  int32_t prefill_target = 0;  // in its prefill phase while num_computed < prefill_target
  int32_t num_preemptions = 0;

  std::vector<BlockId> blocks;          // device blocks, in token order
  std::vector<BlockHash> block_hashes;  // hashes of blocks[0..k) registered for prefix reuse
  std::vector<BlockId> cpu_blocks;      // host blocks while swapped out
  // Changes (to a value unique across all requests) whenever `blocks` changes other than by
  // appending, so a cached block-table row is never mistaken for the current one.
  uint64_t table_version = 0;
  void touch_blocks() {
    static std::atomic<uint64_t> counter{0};
    table_version = ++counter;
  }
  int32_t num_scheduled = 0;  // tokens scheduled in the current step (0 = not yet)
  // Speculative decoding: tokens proposed to follow the sequence (set_draft_tokens), consumed
  // (and cleared) by the next schedule(); dropped on preemption.
  std::vector<int32_t> draft;

  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t num_generated() const { return num_tokens() - num_prompt_tokens; }
  bool in_prefill() const { return num_computed < prefill_target; }
  // Most tokens that will ever be in its cache: the last sampled token is never fed back.
  int32_t max_cached_tokens() const { return num_prompt_tokens + params.max_tokens - 1; }
};

// Ordering of the queues: (priority, arrival). Arrivals are unique, so this is a total order.
struct RequestKeyLess {
  bool operator()(const Request* a, const Request* b) const {
    if (a->priority != b->priority) return a->priority < b->priority;
    return a->arrival < b->arrival;
  }
};

}  // namespace pagedkv
