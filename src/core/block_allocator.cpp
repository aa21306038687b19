// BlockAllocator: the device block pool — ref counts, the free queue, allocate/free/fork and
// copy-on-write. Prefix caching is in prefix_cache.cpp, the host pool in swap_pool.cpp.
#include <algorithm>
#include <sstream>

#include "core/block_allocator_impl.h"
#include "pagedkv/error.h"

namespace pagedkv {

const char* status_message(Status s) {
  switch (s) {
    case Status::kOk: return "ok";
    case Status::kOutOfBlocks: return "not enough free blocks";
    case Status::kInvalidBlock: return "block id out of range";
    case Status::kNotAllocated:
      return "block is not allocated (ref count 0: double free or never "
             "allocated)";
    case Status::kInvalidArgument: return "invalid argument";
  }
  return "unknown status";
}

BlockAllocator::Impl::Impl(const BlockAllocatorConfig& c)
    : num_blocks(c.num_blocks),
      block_size(c.block_size),
      prefix_caching(c.enable_prefix_caching),
      ref(c.num_blocks, 0),
      free_queue(c.num_blocks),
      table(c.enable_prefix_caching ? c.num_blocks : 0),
      child_head(c.enable_prefix_caching ? c.num_blocks : 0),
      cpu_ref(c.num_cpu_blocks, 0) {
  for (BlockId id = 0; id < num_blocks; ++id) free_queue.push_back(id);
  // Host ids are handed out lowest first: push them in reverse onto the stack.
  cpu_free.reserve(c.num_cpu_blocks);
  for (BlockId id = c.num_cpu_blocks - 1; id >= 0; --id) cpu_free.push_back(id);
  if (prefix_caching) {
    cached.assign(num_blocks, 0);
    hash.resize(num_blocks);
    parent.resize(num_blocks);
    extra.assign(num_blocks, 0);
    next_sibling.assign(num_blocks, -1);
    prev_sibling.assign(num_blocks, -1);
    tokens.assign(static_cast<size_t>(num_blocks) * block_size, 0);
  }
}

BlockId BlockAllocator::Impl::pop_free() {
  BlockId id = free_queue.pop_front();
  if (prefix_caching && cached[id]) {
    uncache(id);
    --num_cached_free;
    ++counters.evictions;
  }
  ref[id] = 1;
  return id;
}

void BlockAllocator::Impl::enqueue_free(BlockId id) {
  if (prefix_caching && cached[id]) {
    free_queue.push_back(id);
    ++num_cached_free;
  } else {
    free_queue.push_front(id);
  }
}

void BlockAllocator::Impl::acquire(BlockId id) {
  if (ref[id] == 0) {
    free_queue.remove(id);
    if (prefix_caching && cached[id]) --num_cached_free;
  }
  ++ref[id];
}

Status BlockAllocator::Impl::release(const BlockId* ids, size_t n) {
  // Pass 1: decrement, undoing everything on the first bad id (repeated ids are caught because
  // their ref count runs out).
  for (size_t i = 0; i < n; ++i) {
    BlockId id = ids[i];
    Status bad =
        !valid(id) ? Status::kInvalidBlock : (ref[id] <= 0 ? Status::kNotAllocated : Status::kOk);
    if (bad != Status::kOk) {
      for (size_t j = 0; j < i; ++j) ++ref[ids[j]];
      return bad;
    }
    --ref[id];
  }
  // Pass 2, tail first: a block appears once in the queue even if it was listed twice.
  for (size_t i = n; i-- > 0;) {
    BlockId id = ids[i];
    if (ref[id] == 0 && !free_queue.contains(id)) enqueue_free(id);
  }
  return Status::kOk;
}

BlockAllocator::BlockAllocator(const BlockAllocatorConfig& config) {
  PAGEDKV_CHECK(config.num_blocks >= 0, "num_blocks must be >= 0, got ", config.num_blocks);
  PAGEDKV_CHECK(config.block_size >= 1, "block_size must be >= 1, got ", config.block_size);
  PAGEDKV_CHECK(config.num_cpu_blocks >= 0, "num_cpu_blocks must be >= 0, got ",
                config.num_cpu_blocks);
  PAGEDKV_CHECK(static_cast<int64_t>(config.num_blocks) * config.block_size <= INT32_MAX ||
                    !config.enable_prefix_caching,
                "num_blocks * block_size must fit in int32 with prefix caching, got ",
                config.num_blocks, " * ", config.block_size);
  impl_ = new Impl(config);
}

BlockAllocator::~BlockAllocator() { delete impl_; }

int32_t BlockAllocator::num_blocks() const { return impl_->num_blocks; }
int32_t BlockAllocator::block_size() const { return impl_->block_size; }
int32_t BlockAllocator::num_free_blocks() const { return impl_->free_queue.size(); }
int32_t BlockAllocator::num_cached_free_blocks() const { return impl_->num_cached_free; }
int32_t BlockAllocator::num_used_blocks() const {
  return impl_->num_blocks - impl_->free_queue.size();
}
bool BlockAllocator::enable_prefix_caching() const { return impl_->prefix_caching; }
const AllocatorCounters& BlockAllocator::counters() const { return impl_->counters; }

Status BlockAllocator::allocate(int32_t n, std::vector<BlockId>* out) {
  if (n < 0 || out == nullptr) return Status::kInvalidArgument;
  if (n > impl_->free_queue.size()) return Status::kOutOfBlocks;
  out->reserve(out->size() + n);
  for (int32_t i = 0; i < n; ++i) out->push_back(impl_->pop_free());
  return Status::kOk;
}

Status BlockAllocator::free(const BlockId* ids, size_t n) {
  if (n > 0 && ids == nullptr) return Status::kInvalidArgument;
  return impl_->release(ids, n);
}

Status BlockAllocator::fork(const BlockId* ids, size_t n) {
  if (n > 0 && ids == nullptr) return Status::kInvalidArgument;
  for (size_t i = 0; i < n; ++i) {
    if (!impl_->valid(ids[i])) return Status::kInvalidBlock;
    if (impl_->ref[ids[i]] <= 0) return Status::kNotAllocated;
  }
  for (size_t i = 0; i < n; ++i) ++impl_->ref[ids[i]];
  return Status::kOk;
}

int32_t BlockAllocator::ref_count(BlockId id) const {
  return impl_->valid(id) ? impl_->ref[id] : -1;
}

Status BlockAllocator::copy_on_write(BlockId* id, bool* copied) {
  if (id == nullptr) return Status::kInvalidArgument;
  if (copied) *copied = false;
  BlockId src = *id;
  if (!impl_->valid(src)) return Status::kInvalidBlock;
  if (impl_->ref[src] <= 0) return Status::kNotAllocated;
  bool is_cached = impl_->prefix_caching && impl_->cached[src];
  if (impl_->ref[src] == 1 && !is_cached) return Status::kOk;  // private: write in place
  if (impl_->free_queue.empty()) return Status::kOutOfBlocks;
  BlockId dst = impl_->pop_free();  // src has ref >= 1, so it cannot be the popped block
  if (impl_->ref[src] == 1) {
    impl_->pinned_sources.push_back(src);  // last reference: kept until the copy is taken
  } else {
    impl_->release(&src, 1);  // still shared: the last sharer may then write it in place
  }
  impl_->pending_copies.emplace_back(src, dst);
  ++impl_->counters.cow_copies;
  *id = dst;
  if (copied) *copied = true;
  return Status::kOk;
}

std::vector<std::pair<int64_t, int64_t>> BlockAllocator::take_pending_copies() {
  std::vector<std::pair<int64_t, int64_t>> out;
  out.swap(impl_->pending_copies);
  for (BlockId src : impl_->pinned_sources) impl_->release(&src, 1);  // in recording order
  impl_->pinned_sources.clear();
  return out;
}

std::string BlockAllocator::check_invariants() const {
  const Impl& m = *impl_;
  std::ostringstream err;
  int32_t zero = 0, cached_free = 0, cached_total = 0;
  for (BlockId id = 0; id < m.num_blocks; ++id) {
    if (m.ref[id] < 0) err << "block " << id << " has ref " << m.ref[id] << "; ";
    if ((m.ref[id] == 0) != m.free_queue.contains(id))
      err << "block " << id << " ref " << m.ref[id] << " but queued=" << m.free_queue.contains(id)
          << "; ";
    zero += m.ref[id] == 0;
    if (m.prefix_caching && m.cached[id]) {
      ++cached_total;
      cached_free += m.ref[id] == 0;
      if (m.table.find(m.hash[id]) != id) err << "cached block " << id << " not in table; ";
    }
  }
  if (zero != m.free_queue.size())
    err << "free queue size " << m.free_queue.size() << " != " << zero << "; ";
  if (cached_free != m.num_cached_free) err << "num_cached_free mismatch; ";
  if (cached_total != static_cast<int32_t>(m.table.size())) err << "table size mismatch; ";
  // Sibling lists: every cached block exactly once, under its parent, links consistent.
  size_t num_children = 0;
  m.child_head.for_each([&](const BlockHash& parent, int32_t head) {
    int32_t prev = -1;
    for (int32_t c = head; c != -1 && num_children <= m.table.size(); c = m.next_sibling[c]) {
      ++num_children;
      if (!m.cached[c] || m.parent[c] != parent || m.prev_sibling[c] != prev)
        err << "children index entry " << c << " inconsistent; ";
      prev = c;
    }
  });
  if (num_children != m.table.size()) err << "children index size mismatch; ";
  // Queue order: uncached blocks must precede cached ones (they are reused first).
  bool seen_cached = false;
  for (BlockId id = m.free_queue.front(); id != -1; id = m.free_queue.next(id)) {
    bool c = m.prefix_caching && m.cached[id];
    if (!c && seen_cached) {
      err << "uncached block " << id << " queued after a cached one; ";
      break;
    }
    seen_cached |= c;
  }
  int32_t cpu_zero = 0;
  for (int32_t r : m.cpu_ref) cpu_zero += r == 0;
  if (cpu_zero != static_cast<int32_t>(m.cpu_free.size())) err << "host free list mismatch; ";
  return err.str();
}

}  // namespace pagedkv
