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

namespace {

// Checks that each host id is allocated, repeated ids counted against the ref count: decrements
// as a release would, then restores every count. Changes nothing.
Status check_cpu_ids(std::vector<int32_t>& cpu_ref, const BlockId* ids, size_t n) {
  Status s = Status::kOk;
  size_t done = 0;
  for (; done < n; ++done) {
    BlockId id = ids[done];
    if (id < 0 || id >= static_cast<BlockId>(cpu_ref.size())) {
      s = Status::kInvalidBlock;
      break;
    }
    if (cpu_ref[id] <= 0) {
      s = Status::kNotAllocated;
      break;
    }
    --cpu_ref[id];
  }
  for (size_t j = 0; j < done; ++j) ++cpu_ref[ids[j]];
  return s;
}

}  // namespace

Status BlockAllocator::swap_out(const BlockId* ids, size_t n, std::vector<BlockId>* cpu_ids,
                                std::vector<std::pair<int64_t, int64_t>>* mapping) {
  Impl& m = *impl_;
  if ((n > 0 && ids == nullptr) || cpu_ids == nullptr || mapping == nullptr)
    return Status::kInvalidArgument;
  // Validate the ids first (a bad id is reported as such, not as a lack of host memory).
  for (size_t i = 0; i < n; ++i) {
    if (!m.valid(ids[i])) return Status::kInvalidBlock;
    if (m.ref[ids[i]] <= 0) return Status::kNotAllocated;
  }
  if (n > m.cpu_free.size()) {
    // Repeated ids beyond their ref count are still a bad-id error: check with a dry release.
    Status s = m.release(ids, n);
    if (s != Status::kOk) return s;
    for (size_t i = 0; i < n; ++i) m.acquire(ids[i]);
    return Status::kOutOfBlocks;
  }
  Status s = m.release(ids, n);  // all or nothing
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
  Status s = check_cpu_ids(m.cpu_ref, cpu_ids, n);
  if (s != Status::kOk) return s;
  for (size_t i = 0; i < n; ++i) --m.cpu_ref[cpu_ids[i]];
  // Tail first; a repeated id is pushed once (marked -1 until the loop ends).
  for (size_t i = n; i-- > 0;) {
    BlockId id = cpu_ids[i];
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
  Status s = check_cpu_ids(m.cpu_ref, cpu_ids, n);
  if (s != Status::kOk) return s;
  if (n > static_cast<size_t>(m.free_queue.size())) return Status::kOutOfBlocks;
  free_cpu(cpu_ids, n);
  for (size_t i = 0; i < n; ++i) {
    BlockId dev = m.pop_free();
    ids->push_back(dev);
    mapping->emplace_back(cpu_ids[i], dev);
  }
  m.counters.swapped_in_blocks += static_cast<int64_t>(n);
  return Status::kOk;
}

}  // namespace pagedkv
