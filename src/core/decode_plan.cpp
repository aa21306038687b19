// The work-balanced decode planner (pagedkv/decode_plan.h): pure host code, run by the engine once
// per step on the host copy of seq_lens, and by the CPU decode itself.
#include "pagedkv/decode_plan.h"

#include <algorithm>
#include <vector>

#include "pagedkv/error.h"

namespace pagedkv {
namespace {

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// Sequence s's visible keys [lo, len): its sliding window (> 0), else all of them.
struct Visible {
  int64_t lo, len;
  int64_t count() const { return len - lo; }
};

Visible visible_keys(int32_t len, int sliding_window) {
  const int64_t lo = sliding_window > 0 ? std::max<int64_t>(0, int64_t(len) - sliding_window) : 0;
  return {lo, len};
}

// The piece length: total / target_items keys, in whole units, at least min_chunk; longer where
// that many items would not fit `capacity` (each non-empty sequence adds at most one item to
// total / length, so total / (capacity - nonempty) keys always fit).
int64_t piece_length(int64_t total, int64_t longest, int64_t nonempty, int target_items,
                     int min_chunk, int capacity) {
  const int64_t unit = kBalancedKeyUnit;
  int64_t chunk = std::max(round_up(min_chunk, unit),
                           round_up((total + target_items - 1) / target_items, unit));
  if ((total + chunk - 1) / chunk + nonempty <= capacity) return chunk;
  const int64_t spare = capacity - nonempty;
  return spare > 0 ? std::max(chunk, round_up((total + spare - 1) / spare, unit))
                   : std::max<int64_t>(unit, round_up(longest, unit));
}

}  // namespace

int plan_balanced_decode(const int32_t* seq_lens, int num_seqs, int sliding_window,
                         int target_items, int min_chunk, int capacity, int32_t* work_items,
                         int32_t* seq_offsets) {
  PAGEDKV_CHECK(num_seqs >= 0, "num_seqs must be >= 0, got ", num_seqs);
  PAGEDKV_CHECK(target_items >= 1, "target_items must be >= 1, got ", target_items);
  PAGEDKV_CHECK(min_chunk >= 2 * kBalancedKeyUnit, "min_chunk must be >= ", 2 * kBalancedKeyUnit,
                " keys, got ", min_chunk);
  PAGEDKV_CHECK(capacity >= 0, "capacity must be >= 0, got ", capacity);
  int64_t total = 0, longest = 0, nonempty = 0;
  for (int s = 0; s < num_seqs; ++s) {
    PAGEDKV_CHECK(seq_lens[s] >= 0, "seq_lens[", s, "] = ", seq_lens[s], " must be >= 0");
    const int64_t n = visible_keys(seq_lens[s], sliding_window).count();
    total += n;
    longest = std::max(longest, n);
    nonempty += n > 0;
  }
  PAGEDKV_CHECK(nonempty <= capacity, "the plan has room for ", capacity, " work items but ",
                nonempty, " sequences have keys to attend to");
  const int64_t chunk = piece_length(total, longest, nonempty, target_items, min_chunk, capacity);
  // Pieces of sequence s: boundaries lo + j * visible / n rounded up to whole units (pieces are
  // longer than chunk / 2 >= one unit, so the rounding keeps them non-empty and in order). Their
  // rows follow the sequences; the list is then ordered longest first.
  struct Piece {
    int32_t seq, lo, hi, row;
  };
  std::vector<Piece> pieces;
  pieces.reserve(static_cast<size_t>(std::min<int64_t>(capacity, total / chunk + nonempty)));
  int32_t item = 0;
  for (int s = 0; s < num_seqs; ++s) {
    seq_offsets[s] = item;
    const Visible v = visible_keys(seq_lens[s], sliding_window);
    const int64_t n = (v.count() + chunk - 1) / chunk;
    PAGEDKV_CHECK(item + n <= capacity, "internal: the plan outgrew its capacity");
    for (int64_t j = 0; j < n; ++j) {
      const int64_t lo = j == 0 ? v.lo : round_up(v.lo + j * v.count() / n, kBalancedKeyUnit);
      const int64_t hi =
          j + 1 == n ? v.len : round_up(v.lo + (j + 1) * v.count() / n, kBalancedKeyUnit);
      pieces.push_back({s, static_cast<int32_t>(lo), static_cast<int32_t>(hi), item});
      ++item;
    }
  }
  seq_offsets[num_seqs] = item;
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const Piece& a, const Piece& b) { return a.hi - a.lo > b.hi - b.lo; });
  for (int i = 0; i < capacity; ++i) {
    int32_t* w = work_items + int64_t(i) * kBalancedItemInts;
    const Piece p = i < item ? pieces[i] : Piece{-1, 0, 0, -1};
    w[0] = p.seq;
    w[1] = p.lo;
    w[2] = p.hi;
    w[3] = p.row;
  }
  return item;
}

}  // namespace pagedkv
