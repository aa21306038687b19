// FreeBlockQueue: an intrusive doubly linked list over block ids 0..n-1 with O(1) push at either
// end, pop from the head and removal of any member. The links live in two int32 arrays indexed by
// block id (no per-node allocation); index n is the sentinel of the circular list.
#pragma once

#include <cstdint>
#include <vector>

namespace pagedkv::detail {

class FreeBlockQueue {
 public:
  static constexpr int32_t kNotQueued = -1;

  explicit FreeBlockQueue(int32_t n) : n_(n), prev_(n + 1, kNotQueued), next_(n + 1, kNotQueued) {
    prev_[n_] = next_[n_] = n_;  // empty circular list: the sentinel points at itself
  }

  int32_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  bool contains(int32_t id) const { return prev_[id] != kNotQueued; }
  // Oldest member (next to be reused), or -1 when empty.
  int32_t front() const { return size_ ? next_[n_] : -1; }
  // Member after `id` (towards the tail), or -1 at the tail; for iteration.
  int32_t next(int32_t id) const { return next_[id] == n_ ? -1 : next_[id]; }

  void push_back(int32_t id) { link(prev_[n_], id, n_); }
  void push_front(int32_t id) { link(n_, id, next_[n_]); }

  // Unlinks and returns the head. Precondition: !empty().
  int32_t pop_front() {
    int32_t id = next_[n_];
    remove(id);
    return id;
  }

  // Precondition: contains(id).
  void remove(int32_t id) {
    int32_t p = prev_[id], q = next_[id];
    next_[p] = q;
    prev_[q] = p;
    prev_[id] = next_[id] = kNotQueued;
    --size_;
  }

 private:
  void link(int32_t before, int32_t id, int32_t after) {
    next_[before] = id;
    prev_[id] = before;
    next_[id] = after;
    prev_[after] = id;
    ++size_;
  }

  int32_t n_;
  int32_t size_ = 0;
  std::vector<int32_t> prev_;  // [n + 1] int32, kNotQueued when not a member
  std::vector<int32_t> next_;  // [n + 1] int32
};

}  // namespace pagedkv::detail
