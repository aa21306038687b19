// Automatic prefix caching: full blocks are registered under their chained hash and matched by
// later prompts. Cached blocks with ref count 0 stay in the free queue until popped for reuse (lazy
// eviction in block_allocator.cpp), so caching costs nothing when memory is needed.
#include <algorithm>
#include <cstring>

#include "core/block_allocator_impl.h"
#include "pagedkv/error.h"

namespace pagedkv {

void BlockAllocator::Impl::uncache(BlockId id) {
  if (table.find(hash[id]) == id) table.erase(hash[id]);
  // O(1) unlink from the parent's sibling list.
  int32_t prev = prev_sibling[id], next = next_sibling[id];
  if (prev != -1) {
    next_sibling[prev] = next;
  } else if (next != -1) {
    child_head.put(parent[id], next);
  } else {
    child_head.erase(parent[id]);
  }
  if (next != -1) prev_sibling[next] = prev;
  cached[id] = 0;
}

bool BlockAllocator::Impl::block_matches(BlockId id, const BlockHash& parent_hash,
                                         const int32_t* toks, uint64_t extra_key) const {
  return parent[id] == parent_hash && extra[id] == extra_key &&
         std::memcmp(&tokens[static_cast<size_t>(id) * block_size], toks,
                     sizeof(int32_t) * block_size) == 0;
}

BlockId BlockAllocator::Impl::lookup(const BlockHash& h, const BlockHash& parent_hash,
                                     const int32_t* toks, uint64_t extra_key,
                                     bool* collided) const {
  BlockId id = table.find(h);
  if (id == detail::HashIndex::kNone) return kNoBlock;
  if (block_matches(id, parent_hash, toks, extra_key)) return id;
  if (collided) *collided = true;
  return kNoBlock;
}

int32_t BlockAllocator::num_cached_blocks() const {
  return static_cast<int32_t>(impl_->table.size());
}

bool BlockAllocator::cached_hash(BlockId id, BlockHash* out) const {
  if (!impl_->valid(id) || !impl_->prefix_caching || !impl_->cached[id]) return false;
  if (out) *out = impl_->hash[id];
  return true;
}

int32_t BlockAllocator::peek_prefix(const int32_t* tokens, size_t num_tokens, uint64_t extra_key,
                                    int32_t max_blocks) const {
  const Impl& m = *impl_;
  if (!m.prefix_caching || tokens == nullptr) return 0;
  return static_cast<int32_t>(m.walk_prefix(tokens, num_tokens, extra_key, max_blocks, nullptr,
                                            [](BlockId, const BlockHash&) {}));
}

int32_t BlockAllocator::match_prefix(const int32_t* tokens, size_t num_tokens, uint64_t extra_key,
                                     int32_t max_blocks, std::vector<BlockId>* out,
                                     std::vector<BlockHash>* hashes) {
  Impl& m = *impl_;
  if (!m.prefix_caching || tokens == nullptr || out == nullptr) return 0;
  const size_t i = m.walk_prefix(tokens, num_tokens, extra_key, max_blocks,
                                 &m.counters.hash_collisions, [&](BlockId id, const BlockHash& h) {
                                   m.acquire(id);
                                   out->push_back(id);
                                   if (hashes) hashes->push_back(h);
                                 });
  ++m.counters.prefix_queries;
  m.counters.prefix_queries_tokens += static_cast<int64_t>(num_tokens);
  m.counters.prefix_hits_tokens += static_cast<int64_t>(i) * m.block_size;
  m.counters.prefix_hit_queries += i > 0;
  return static_cast<int32_t>(i);
}

int32_t BlockAllocator::match_prefix_tokens(const int32_t* tokens, size_t num_tokens,
                                            uint64_t extra_key, int32_t max_tokens,
                                            std::vector<BlockId>* out,
                                            std::vector<BlockHash>* hashes) {
  Impl& m = *impl_;
  if (!m.prefix_caching || tokens == nullptr || out == nullptr) return 0;
  size_t cap = max_tokens < 0 ? num_tokens : std::min(num_tokens, static_cast<size_t>(max_tokens));
  std::vector<BlockHash> local;
  std::vector<BlockHash>* hs = hashes ? hashes : &local;
  size_t hs_first = hs->size();
  // Counts the query over num_tokens (and the full-block hits) like match_prefix.
  int32_t full = match_prefix(tokens, num_tokens, extra_key,
                              static_cast<int32_t>(cap / m.block_size), out, hs);
  size_t done = static_cast<size_t>(full) * m.block_size;
  size_t want = std::min(cap - done, static_cast<size_t>(m.block_size - 1));
  if (want == 0 || m.free_queue.empty()) return static_cast<int32_t>(done);
  BlockHash h = full > 0 ? (*hs)[hs_first + full - 1] : kRootHash;
  BlockId head = m.child_head.find(h);
  if (head == detail::HashIndex::kNone) return static_cast<int32_t>(done);
  // Longest common prefix with the next tokens over the cached children of the last block.
  const int32_t* rest = tokens + done;
  BlockId best = kNoBlock;
  size_t best_k = 0;
  // The source must not be the last free block: copying needs another one.
  const bool last_free_only = m.free_queue.size() == 1;
  // A bounded scan (a parent such as the root can have thousands of cached children): the
  // kPartialScan most recently registered ones, stopping early at a best possible match.
  constexpr size_t kPartialScan = 64;
  size_t seen = 0;
  for (BlockId c = head; c != -1 && seen < kPartialScan && best_k < want; c = m.next_sibling[c]) {
    ++seen;
    if (m.extra[c] != extra_key || (last_free_only && m.ref[c] == 0)) continue;
    const int32_t* ct = &m.tokens[static_cast<size_t>(c) * m.block_size];
    size_t k = 0;
    while (k < want && ct[k] == rest[k]) ++k;
    if (k > best_k) best_k = k, best = c;
  }
  if (best == kNoBlock) return static_cast<int32_t>(done);
  // Pin the source while allocating so that the allocation cannot evict it, then unpin: it goes
  // back to the tail of the free queue (most recently used) if nobody else holds it.
  m.acquire(best);  // now free_queue is not empty (see last_free_only)
  BlockId dst = m.pop_free();
  m.pinned_sources.push_back(best);  // released by take_pending_copies()
  m.pending_copies.emplace_back(best, dst);
  ++m.counters.cow_copies;
  out->push_back(dst);
  m.counters.prefix_hits_tokens += static_cast<int64_t>(best_k);
  m.counters.partial_hit_tokens += static_cast<int64_t>(best_k);
  if (full == 0) ++m.counters.prefix_hit_queries;
  return static_cast<int32_t>(done + best_k);
}

BlockHash BlockAllocator::cache_full_block(BlockId id, const BlockHash& parent,
                                           const int32_t* tokens, uint64_t extra_key) {
  BlockHash h;
  Status s = try_cache_full_block(id, parent, tokens, extra_key, &h);
  PAGEDKV_CHECK(s == Status::kOk, "cache_full_block: id ", id, ": ", status_message(s));
  return h;
}

Status BlockAllocator::try_cache_full_block(BlockId id, const BlockHash& parent,
                                            const int32_t* tokens, uint64_t extra_key,
                                            BlockHash* out) {
  Impl& m = *impl_;
  if (tokens == nullptr) return Status::kInvalidArgument;
  if (!m.valid(id)) return Status::kInvalidBlock;
  if (m.ref[id] <= 0) return Status::kNotAllocated;
  BlockHash h = hash_block(parent, tokens, m.block_size, extra_key);
  if (out) *out = h;
  if (!m.prefix_caching) return Status::kOk;
  if (m.cached[id]) return m.hash[id] == h ? Status::kOk : Status::kInvalidArgument;
  if (m.table.find(h) != detail::HashIndex::kNone) return Status::kOk;  // duplicate: uncached
  m.table.put(h, id);
  BlockId head = m.child_head.find(parent);  // becomes the newest child of `parent`
  m.next_sibling[id] = head;
  m.prev_sibling[id] = -1;
  if (head != detail::HashIndex::kNone) m.prev_sibling[head] = id;
  m.child_head.put(parent, id);
  m.cached[id] = 1;
  m.hash[id] = h;
  m.parent[id] = parent;
  m.extra[id] = extra_key;
  std::memcpy(&m.tokens[static_cast<size_t>(id) * m.block_size], tokens,
              sizeof(int32_t) * m.block_size);
  return Status::kOk;
}

void BlockAllocator::reset_prefix_cache() {
  Impl& m = *impl_;
  if (!m.prefix_caching) return;
  std::fill(m.cached.begin(), m.cached.end(), 0);
  m.table.clear();
  m.child_head.clear();
  m.num_cached_free = 0;
}

}  // namespace pagedkv
