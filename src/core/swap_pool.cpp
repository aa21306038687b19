// The host (CPU) swap pool: a free stack of host block ids with their own ref counts. Swapping
// produces (src, dst) mappings for ops.swap_blocks; the caller runs them before the step's KV
// writes (the freed source blocks may be handed out again in the same step).
#include "core/block_allocator_impl.h"

namespace pagedkv {

int32_t BlockAllocator::num_cpu_blocks() const {
  return static_cast<int32_t>(impl_->cpu_ref.size());
}

int32_t BlockAllocator::num_free_cpu_blocks() const {
  return static_cast<int32_t>(impl_->cpu_free.size());
}

int32_t BlockAllocator::cpu_ref_count(BlockId id) const {
  if (id < 0 || id >= num_cpu_blocks()) return -1;
  return impl_->cpu_ref[id];
}

Status BlockAllocator::swap_out(const BlockId* ids, size_t n, std::vector<BlockId>* cpu_ids,
                                std::vector<std::pair<int64_t, int64_t>>* mapping) {
  Impl& m = *impl_;
  if ((n > 0 && ids == nullptr) || cpu_ids == nullptr || mapping == nullptr)
    return Status::kInvalidArgument;
  if (n > m.cpu_free.size()) return Status::kOutOfBlocks;
  Status s = m.release(ids, n);  // validates every id first (all or nothing)
  if (s != Status::kOk) return s;
  for (size_t i = 0; i < n; ++i) {
    BlockId host = m.cpu_free.back();
    m.cpu_free.pop_back();
    m.cpu_ref[host] = 1;
    cpu_ids->push_back(host);
    mapping->emplace_back(ids[i], host);
  }
  m.counters.swapped_out_blocks += static_cast<int64_t>(n);
  return Status::kOk;
}

Status BlockAllocator::free_cpu(const BlockId* cpu_ids, size_t n) {
  Impl& m = *impl_;
  if (n > 0 && cpu_ids == nullptr) return Status::kInvalidArgument;
  const int32_t num = num_cpu_blocks();
  for (size_t i = 0; i < n; ++i) {
    BlockId id = cpu_ids[i];
    Status bad = (id < 0 || id >= num) ? Status::kInvalidBlock
                                       : (m.cpu_ref[id] <= 0 ? Status::kNotAllocated : Status::kOk);
    if (bad != Status::kOk) {
      for (size_t j = 0; j < i; ++j) ++m.cpu_ref[cpu_ids[j]];
      return bad;
    }
    --m.cpu_ref[id];
  }
  for (size_t i = n; i-- > 0;) {
    BlockId id = cpu_ids[i];
    // Pushed once: mark with -1 until the loop ends so a repeated id is not pushed twice.
    if (m.cpu_ref[id] == 0) {
      m.cpu_ref[id] = -1;
      m.cpu_free.push_back(id);
    }
  }
  for (size_t i = 0; i < n; ++i)
    if (m.cpu_ref[cpu_ids[i]] == -1) m.cpu_ref[cpu_ids[i]] = 0;
  return Status::kOk;
}

Status BlockAllocator::swap_in(const BlockId* cpu_ids, size_t n, std::vector<BlockId>* ids,
                               std::vector<std::pair<int64_t, int64_t>>* mapping) {
  Impl& m = *impl_;
  if ((n > 0 && cpu_ids == nullptr) || ids == nullptr || mapping == nullptr)
    return Status::kInvalidArgument;
  if (n > static_cast<size_t>(m.free_queue.size())) {
    // Validate the ids anyway so a bad id is reported as such, not as a lack of memory.
    for (size_t i = 0; i < n; ++i) {
      if (cpu_ids[i] < 0 || cpu_ids[i] >= num_cpu_blocks()) return Status::kInvalidBlock;
      if (m.cpu_ref[cpu_ids[i]] <= 0) return Status::kNotAllocated;
    }
    return Status::kOutOfBlocks;
  }
  Status s = free_cpu(cpu_ids, n);  // validates (all or nothing)
  if (s != Status::kOk) return s;
  for (size_t i = 0; i < n; ++i) {
    BlockId dev = m.pop_free();
    ids->push_back(dev);
    mapping->emplace_back(cpu_ids[i], dev);
  }
  m.counters.swapped_in_blocks += static_cast<int64_t>(n);
  return Status::kOk;
}

}  // namespace pagedkv
