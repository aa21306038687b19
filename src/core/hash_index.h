// HashIndex: a fixed-capacity open-addressing map BlockHash -> int32 (linear probing,
// backward-shift deletion, no tombstones). The prefix cache never holds more entries than
// there are blocks, so the table is sized once (load factor <= 1/2) and never rehashes or
// allocates afterwards: inserts and evictions on the scheduling hot path touch one or two
// cache lines instead of allocating and freeing a node as std::unordered_map does.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "pagedkv/block_allocator.h"

namespace pagedkv::detail {

class HashIndex {
 public:
  static constexpr int32_t kNone = -1;

  explicit HashIndex(int32_t max_entries) {
    size_t cap = 16;
    while (cap < 2 * static_cast<size_t>(std::max(max_entries, 1))) cap <<= 1;
    mask_ = cap - 1;
    keys_.resize(cap);
    vals_.assign(cap, kNone);
  }

  size_t size() const { return size_; }

  // Value stored under h, or kNone.
  int32_t find(const BlockHash& h) const {
    for (size_t i = home(h);; i = (i + 1) & mask_) {
      if (vals_[i] == kNone) return kNone;
      if (keys_[i] == h) return vals_[i];
    }
  }

  // Inserts or overwrites. Precondition for a new key: size() < max_entries.
  void put(const BlockHash& h, int32_t v) {
    size_t i = home(h);
    for (; vals_[i] != kNone; i = (i + 1) & mask_) {
      if (keys_[i] == h) {
        vals_[i] = v;
        return;
      }
    }
    keys_[i] = h;
    vals_[i] = v;
    ++size_;
  }

  // Removes h if present.
  void erase(const BlockHash& h) {
    size_t i = home(h);
    for (;; i = (i + 1) & mask_) {
      if (vals_[i] == kNone) return;
      if (keys_[i] == h) break;
    }
    // Backward shift: move later members of the probe run into the hole when their home slot
    // does not lie cyclically in (hole, j].
    for (size_t j = (i + 1) & mask_; vals_[j] != kNone; j = (j + 1) & mask_) {
      size_t k = home(keys_[j]);
      bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
      if (stays) continue;
      keys_[i] = keys_[j];
      vals_[i] = vals_[j];
      i = j;
    }
    vals_[i] = kNone;
    --size_;
  }

  void clear() {
    std::fill(vals_.begin(), vals_.end(), kNone);
    size_ = 0;
  }

  // Calls fn(key, value) for every entry (consistency checks).
  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (size_t i = 0; i <= mask_; ++i)
      if (vals_[i] != kNone) fn(keys_[i], vals_[i]);
  }

 private:
  // The hash is already well mixed (block_hash.cpp), so its low bits index the table.
  size_t home(const BlockHash& h) const { return static_cast<size_t>(h.lo ^ (h.hi >> 32)) & mask_; }

  size_t mask_ = 0;
  size_t size_ = 0;
  std::vector<BlockHash> keys_;  // [capacity]
  std::vector<int32_t> vals_;    // [capacity] kNone = empty slot
};

}  // namespace pagedkv::detail
