// KvCacheManager: see kv_cache_manager.h.
#include "kv_cache_manager.h"

#include <algorithm>
#include <utility>

namespace pagedkv {

namespace {
BlockAllocatorConfig allocator_config(const SchedulerConfig& c) {
  BlockAllocatorConfig a;
  a.num_blocks = c.num_blocks;
  a.block_size = c.block_size;
  a.num_cpu_blocks = c.num_cpu_blocks;
  a.enable_prefix_caching = c.enable_prefix_caching;
  return a;
}
}  // namespace

KvCacheManager::KvCacheManager(const SchedulerConfig& config)
    : allocator_(allocator_config(config)),
      block_size_(config.block_size),
      prefix_caching_(config.enable_prefix_caching) {}

// The block this step writes first is shared when the request's next token lands inside a
// partially filled block that another sequence (a fork) also references.
static bool write_block_shared(const BlockAllocator& a, const Request& req, int32_t block_size) {
  if (req.num_computed % block_size == 0) return false;
  size_t idx = static_cast<size_t>(req.num_computed / block_size);
  return idx < req.blocks.size() && a.ref_count(req.blocks[idx]) > 1;
}

int32_t KvCacheManager::blocks_needed(const Request& req, int32_t total_tokens) const {
  int32_t grow = blocks_for(total_tokens) - static_cast<int32_t>(req.blocks.size());
  return std::max(grow, 0) + (write_block_shared(allocator_, req, block_size_) ? 1 : 0);
}

bool KvCacheManager::ensure_slots(Request& req, int32_t total_tokens) {
  const int32_t grow = blocks_for(total_tokens) - static_cast<int32_t>(req.blocks.size());
  const bool cow = write_block_shared(allocator_, req, block_size_);
  if (grow <= 0 && !cow) return true;  // the common decode: room left in a private block
  if (std::max(grow, 0) + (cow ? 1 : 0) > allocator_.num_free_blocks()) return false;
  if (cow) {
    bool copied = false;
    BlockId* id = &req.blocks[static_cast<size_t>(req.num_computed / block_size_)];
    if (allocator_.copy_on_write(id, &copied) != Status::kOk) return false;
    if (copied) req.touch_blocks();
  }
  return grow <= 0 || allocator_.allocate(grow, &req.blocks) == Status::kOk;
}

int32_t KvCacheManager::match_prefix(Request& req) {
  if (!prefix_caching_ || !req.blocks.empty()) return 0;
  int32_t max_blocks = (req.num_tokens() - 1) / block_size_;
  if (max_blocks <= 0) return 0;
  // Contiguous tokens: a copy only for a request that already generated some (a resumed one).
  const int32_t* tokens = req.tokens.range(0, req.tokens.size(), &token_scratch_);
  int32_t n = allocator_.match_prefix(tokens, req.tokens.size(), req.params.cache_salt, max_blocks,
                                      &req.blocks, &req.block_hashes);
  req.num_computed = n * block_size_;
  req.touch_blocks();
  return req.num_computed;
}

void KvCacheManager::cache_full_blocks(Request& req) {
  if (!prefix_caching_) return;
  size_t full = static_cast<size_t>(req.num_computed / block_size_);
  full = std::min(full, req.blocks.size());
  while (req.block_hashes.size() < full) {
    size_t j = req.block_hashes.size();
    const BlockHash& parent = j == 0 ? kRootHash : req.block_hashes[j - 1];
    BlockHash h;
    const int32_t* tokens = req.tokens.range(j * block_size_, block_size_, &token_scratch_);
    // Cannot fail for a block this request holds; on a failure the block just stays uncached.
    allocator_.try_cache_full_block(req.blocks[j], parent, tokens, req.params.cache_salt, &h);
    req.block_hashes.push_back(h);
  }
}

void KvCacheManager::truncate(Request& req, int32_t num_tokens) {
  const size_t keep = static_cast<size_t>(blocks_for(num_tokens));
  if (req.blocks.size() <= keep) return;
  allocator_.free(req.blocks.data() + keep, req.blocks.size() - keep);
  req.blocks.resize(keep);
  // Not an append: a block-table row cached for the longer list must be rewritten.
  req.touch_blocks();
}

void KvCacheManager::free_blocks(Request& req) {
  if (!req.blocks.empty()) allocator_.free(req.blocks.data(), req.blocks.size());
  req.blocks.clear();
  req.block_hashes.clear();
  req.touch_blocks();
}

void KvCacheManager::share_prefix(const Request& parent, Request& child, int32_t num_tokens) {
  size_t n = std::min(static_cast<size_t>(blocks_for(num_tokens)), parent.blocks.size());
  child.blocks.assign(parent.blocks.begin(), parent.blocks.begin() + n);
  allocator_.fork(child.blocks.data(), n);
  size_t h = std::min(parent.block_hashes.size(), n);
  child.block_hashes.assign(parent.block_hashes.begin(), parent.block_hashes.begin() + h);
  child.touch_blocks();
}

bool KvCacheManager::swap_out(Request& req, BlockPairs* mapping) {
  if (req.blocks.empty()) return true;
  scratch_.clear();
  if (allocator_.swap_out(req.blocks.data(), req.blocks.size(), &scratch_, mapping) !=
      Status::kOk) {
    return false;
  }
  req.cpu_blocks.swap(scratch_);
  req.blocks.clear();
  req.block_hashes.clear();  // the device blocks they named are gone; re-registered on swap-in
  req.touch_blocks();
  return true;
}

bool KvCacheManager::swap_in(Request& req, BlockPairs* mapping) {
  if (req.cpu_blocks.empty()) return true;
  if (allocator_.swap_in(req.cpu_blocks.data(), req.cpu_blocks.size(), &req.blocks, mapping) !=
      Status::kOk) {
    return false;
  }
  req.cpu_blocks.clear();
  req.touch_blocks();
  cache_full_blocks(req);
  return true;
}

void KvCacheManager::free_cpu_blocks(Request& req) {
  if (!req.cpu_blocks.empty()) allocator_.free_cpu(req.cpu_blocks.data(), req.cpu_blocks.size());
  req.cpu_blocks.clear();
}

}  // namespace pagedkv
