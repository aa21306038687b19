// KvCacheManager: per-request block lists on top of the BlockAllocator (internal). Grows a
// request's blocks as it computes tokens, copies shared blocks on write, matches and registers
// cached prefixes, and swaps a request's blocks to and from the host pool.
#pragma once

#include <cstdint>

#include "pagedkv/block_allocator.h"
#include "pagedkv/scheduler_config.h"
#include "pagedkv/step_plan.h"
#include "request.h"

namespace pagedkv {

class KvCacheManager {
 public:
  explicit KvCacheManager(const SchedulerConfig& config);

  BlockAllocator& allocator() { return allocator_; }
  const BlockAllocator& allocator() const { return allocator_; }
  int32_t num_free_blocks() const { return allocator_.num_free_blocks(); }
  int32_t blocks_for(int32_t num_tokens) const {
    return (num_tokens + block_size_ - 1) / block_size_;
  }

  // Device blocks that ensure_slots(req, total_tokens) would take from the free pool, counting
  // a copy-on-write of the partially filled block that this step writes into.
  int32_t blocks_needed(const Request& req, int32_t total_tokens) const;
  // Makes room for `total_tokens` tokens (allocating blocks, copying a shared write block).
  // All or nothing: false when there are not enough free blocks.
  bool ensure_slots(Request& req, int32_t total_tokens);

  // Reuses the longest cached prefix of req.tokens (at most num_tokens - 1 tokens, so the last
  // one is recomputed and sampled from). Sets num_computed. Returns the hit tokens.
  int32_t match_prefix(Request& req);
  // Registers req's blocks that became full since the last call.
  void cache_full_blocks(Request& req);
  // Speculative rollback: frees req's blocks past the first blocks_for(num_tokens) (they hold
  // only rejected draft tokens' KV). Registered hashes are of full accepted blocks: kept.
  void truncate(Request& req, int32_t num_tokens);
  // Frees all device blocks of req (tail-first) and forgets their hashes.
  void free_blocks(Request& req);
  // The child shares the parent's first blocks_for(num_tokens) blocks.
  void share_prefix(const Request& parent, Request& child, int32_t num_tokens);

  bool swap_out(Request& req, BlockPairs* mapping);
  bool swap_in(Request& req, BlockPairs* mapping);
  // Frees the host blocks of a swapped-out request (when it is aborted).
  void free_cpu_blocks(Request& req);

 private:
  BlockAllocator allocator_;
  int32_t block_size_;
  bool prefix_caching_;
  std::vector<BlockId> scratch_;
  std::vector<int32_t> token_scratch_;  // tokens straddling a prompt's end, made contiguous
};

}  // namespace pagedkv
