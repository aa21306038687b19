// BlockAllocator's state, shared by block_allocator.cpp (pool, ref counts, copy-on-write),
// prefix_cache.cpp (hash table, matching) and swap_pool.cpp (host pool). Struct of arrays indexed
// by int32 block id; no per-block allocation.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/free_block_queue.h"
#include "core/hash_index.h"
#include "pagedkv/block_allocator.h"

namespace pagedkv {

struct BlockAllocator::Impl {
  explicit Impl(const BlockAllocatorConfig& c);

  int32_t num_blocks;
  int32_t block_size;
  bool prefix_caching;

  std::vector<int32_t> ref;           // [num_blocks] int32 reference counts
  detail::FreeBlockQueue free_queue;  // every block with ref 0, uncached ones first

  // ---- prefix cache (sized only when enabled) ----
  std::vector<uint8_t> cached;    // [num_blocks] 1 when table[hash[id]] == id
  std::vector<BlockHash> hash;    // [num_blocks] valid when cached
  std::vector<BlockHash> parent;  // [num_blocks] parent hash, valid when cached
  std::vector<uint64_t> extra;    // [num_blocks] extra key, valid when cached
  std::vector<int32_t> tokens;    // [num_blocks * block_size] tokens, valid when cached
  detail::HashIndex table;        // hash -> cached block
  // parent hash -> its most recently registered cached child; the other children follow
  // through next_sibling (for partial-block matching; O(1) unlink on eviction).
  detail::HashIndex child_head;
  std::vector<int32_t> next_sibling;  // [num_blocks] int32, -1 = none
  std::vector<int32_t> prev_sibling;  // [num_blocks] int32, -1 = head of its list
  int32_t num_cached_free = 0;        // cached blocks with ref 0

  std::vector<std::pair<int64_t, int64_t>> pending_copies;  // (src, dst) for copy_blocks
  // Copy sources that no sequence references any more keep one reference until
  // take_pending_copies(), so no allocation in the same step (a swap-in, which the step plan
  // applies before copies) can take and overwrite them before the copy has run.
  std::vector<BlockId> pinned_sources;

  // ---- host swap pool ----
  std::vector<int32_t> cpu_ref;   // [num_cpu_blocks] int32
  std::vector<BlockId> cpu_free;  // stack of free host ids

  AllocatorCounters counters;

  bool valid(BlockId id) const { return id >= 0 && id < num_blocks; }
  // Pops the head of the free queue (precondition: not empty), evicting its hash, ref -> 1.
  BlockId pop_free();
  // Ref count 0 -> in the free queue: cached blocks at the tail (evicted last, LRU), others at the
  // head (reused before any cached block).
  void enqueue_free(BlockId id);
  // Takes one reference on `id` (which may be free and cached).
  void acquire(BlockId id);
  // Drops one reference from each of ids[0..n) with full validation (range, ref > 0, repeated ids
  // counted); all or nothing. Blocks reaching 0 are queued in reverse order (tail first).
  Status release(const BlockId* ids, size_t n);
  void uncache(BlockId id);  // removes id from the table (precondition: cached[id])
  bool block_matches(BlockId id, const BlockHash& parent_hash, const int32_t* toks,
                     uint64_t extra_key) const;
  // Block cached under `h` whose content verifies, or kNoBlock; *collided is set when a block was
  // found under `h` but its content differs.
  BlockId lookup(const BlockHash& h, const BlockHash& parent_hash, const int32_t* toks,
                 uint64_t extra_key, bool* collided) const;
  // Walks the cached full blocks that spell tokens[0..num_tokens) (at most max_blocks; < 0 = no
  // cap), calling on_hit(id, hash) for each in order, and returns how many matched. A block found
  // under the right hash but with other content ends the walk and is counted in *collisions
  // (when given).
  template <typename OnHit>
  size_t walk_prefix(const int32_t* tokens, size_t num_tokens, uint64_t extra_key,
                     int32_t max_blocks, int64_t* collisions, OnHit&& on_hit) const {
    size_t limit = num_tokens / static_cast<size_t>(block_size);
    if (max_blocks >= 0) limit = std::min(limit, static_cast<size_t>(max_blocks));
    BlockHash h = kRootHash;
    size_t i = 0;
    for (; i < limit; ++i) {
      const int32_t* toks = tokens + i * block_size;
      const BlockHash next = hash_block(h, toks, block_size, extra_key);
      bool collided = false;
      const BlockId id = lookup(next, h, toks, extra_key, &collided);
      if (collisions) *collisions += collided;
      if (id == kNoBlock) break;
      on_hit(id, next);
      h = next;
    }
    return i;
  }
};

}  // namespace pagedkv
