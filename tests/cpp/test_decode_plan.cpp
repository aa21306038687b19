// The work-balanced decode planner (pagedkv/decode_plan.h): every visible key in exactly one
// item, items near-equal, boundaries on 16-key chunks, within the plan's capacity.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "error_of.h"
#include "pagedkv/decode_plan.h"

namespace pagedkv {
namespace {

struct Plan {
  std::vector<int32_t> items, offsets;
  int used = 0;
};

Plan make_plan(const std::vector<int32_t>& lens, int window, int target, int min_chunk,
               int capacity) {
  Plan p;
  p.items.assign(size_t(capacity) * kBalancedItemInts, 7777);
  p.offsets.assign(lens.size() + 1, 7777);
  p.used = plan_balanced_decode(lens.data(), static_cast<int>(lens.size()), window, target,
                                min_chunk, capacity, p.items.data(), p.offsets.data());
  return p;
}

// The plan covers each sequence's visible keys exactly once, in order, its pieces in rows
// offsets[s] .. offsets[s + 1] - 1, each row written by one item, inner boundaries on 16-key
// chunks, the items listed longest first and unused ones marked; returns the longest piece.
int check_cover(const Plan& p, const std::vector<int32_t>& lens, int window) {
  const int S = static_cast<int>(lens.size());
  const int cap = static_cast<int>(p.items.size() / kBalancedItemInts);
  std::vector<int> item_of_row(cap, -1);
  int longest = 0, previous = 1 << 30;
  for (int i = 0; i < p.used; ++i) {
    const int32_t* w = &p.items[size_t(i) * kBalancedItemInts];
    EXPECT_TRUE(w[3] >= 0 && w[3] < p.used && item_of_row[w[3]] < 0) << "item " << i;
    if (w[3] >= 0 && w[3] < p.used) item_of_row[w[3]] = i;
    EXPECT_LE(w[2] - w[1], previous) << "item " << i << " is longer than the one before";
    previous = w[2] - w[1];
    longest = std::max(longest, w[2] - w[1]);
  }
  for (int i = p.used; i < cap; ++i) {
    EXPECT_EQ(p.items[size_t(i) * kBalancedItemInts], -1) << "unused item " << i;
    EXPECT_EQ(p.items[size_t(i) * kBalancedItemInts + 3], -1) << "unused item " << i;
  }
  EXPECT_EQ(p.offsets[0], 0);
  EXPECT_EQ(p.offsets[S], p.used);
  for (int s = 0; s < S; ++s) {
    const int lo = window > 0 ? std::max(0, lens[s] - window) : 0;
    int next = lo;
    for (int r = p.offsets[s]; r < p.offsets[s + 1]; ++r) {
      if (item_of_row[r] < 0) {
        ADD_FAILURE() << "row " << r << " has no item";
        return longest;
      }
      const int32_t* w = &p.items[size_t(item_of_row[r]) * kBalancedItemInts];
      EXPECT_EQ(w[0], s) << "row " << r;
      EXPECT_EQ(w[1], next) << "row " << r;
      EXPECT_LT(w[1], w[2]) << "row " << r;
      if (w[1] != lo) EXPECT_EQ(w[1] % kBalancedKeyUnit, 0) << "row " << r;
      next = w[2];
    }
    EXPECT_EQ(next, lens[s]) << "sequence " << s;
  }
  return longest;
}

// The item that writes row r.
const int32_t* item_at_row(const Plan& p, int r) {
  for (size_t i = 0; i < p.items.size(); i += kBalancedItemInts) {
    if (p.items[i + 3] == r) return &p.items[i];
  }
  return nullptr;
}

TEST(BalancedDecodePlan, UniformLengthsSplitEvenly) {
  const std::vector<int32_t> lens(4, 1024);
  const Plan p = make_plan(lens, -1, 16, kBalancedMinChunk, 20);
  EXPECT_EQ(p.used, 16);
  EXPECT_EQ(p.offsets, (std::vector<int32_t>{0, 4, 8, 12, 16}));
  EXPECT_EQ(check_cover(p, lens, -1), 256);
  const int32_t* w = item_at_row(p, 5);  // sequence 1, second piece
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w[0], 1);
  EXPECT_EQ(w[1], 256);
  EXPECT_EQ(w[2], 512);
}

TEST(BalancedDecodePlan, SkewedLengthsGetNearEqualPieces) {
  std::mt19937 rng(3);
  for (double s : {1.0, 1.5}) {
    for (int B : {16, 64, 256}) {
      // Zipf lengths L_i ~ 1 / i^s scaled to a mean of 1024, shuffled (the benchmark's batches).
      std::vector<double> w(B);
      for (int i = 0; i < B; ++i) w[i] = 1.0 / std::pow(i + 1, s);
      const double sum = std::accumulate(w.begin(), w.end(), 0.0);
      std::vector<int32_t> lens(B);
      for (int i = 0; i < B; ++i) lens[i] = std::max(1, int(std::lround(w[i] / sum * 1024 * B)));
      std::shuffle(lens.begin(), lens.end(), rng);
      const int target = 50;
      const int cap = static_cast<int>(balanced_plan_capacity(target, B));
      const Plan p = make_plan(lens, -1, target, kBalancedMinChunk, cap);
      const int longest = check_cover(p, lens, -1);
      const int64_t total = std::accumulate(lens.begin(), lens.end(), int64_t(0));
      // No piece is longer than the balanced share (rounded to whole chunks) plus one chunk.
      const int64_t share = std::max<int64_t>(kBalancedMinChunk, (total + target - 1) / target);
      EXPECT_LE(longest, share + 2 * kBalancedKeyUnit) << "s=" << s << " B=" << B;
      EXPECT_LE(p.used, cap);
      // The longest sequence is cut: far more than one item when it holds most of the work.
      const int top = *std::max_element(lens.begin(), lens.end());
      EXPECT_GE(p.used, std::min<int64_t>(B, total / share)) << "s=" << s << " B=" << B;
      EXPECT_LT(longest, top) << "s=" << s << " B=" << B;
    }
  }
}

TEST(BalancedDecodePlan, SlidingWindowAndEmptySequences) {
  const std::vector<int32_t> lens{0, 5000, 100, 0, 4097};
  const Plan p = make_plan(lens, 1000, 8, 64, 16);
  check_cover(p, lens, 1000);
  EXPECT_EQ(p.offsets[0], p.offsets[1]);  // no keys: no item
  EXPECT_EQ(p.offsets[3], p.offsets[4]);
  EXPECT_EQ(item_at_row(p, p.offsets[1])[1], 4000);  // window start
}

TEST(BalancedDecodePlan, TightCapacityGrowsThePieces) {
  const std::vector<int32_t> lens{3000, 10, 700};
  // Room for one item per sequence only: each sequence is one piece.
  const Plan one = make_plan(lens, -1, 100, kBalancedMinChunk, 3);
  EXPECT_EQ(one.used, 3);
  check_cover(one, lens, -1);
  // Room for 5: the pieces grow until they fit.
  const Plan five = make_plan(lens, -1, 100, kBalancedMinChunk, 5);
  EXPECT_LE(five.used, 5);
  EXPECT_GT(five.used, 3);
  check_cover(five, lens, -1);
}

TEST(BalancedDecodePlan, RefusesBadArguments) {
  using testing::error_of;
  std::vector<int32_t> items(40), offsets(3);
  const std::vector<int32_t> neg{5, -1};
  EXPECT_NE(error_of([&] {
              plan_balanced_decode(neg.data(), 2, -1, 4, 128, 10, items.data(), offsets.data());
            }).find("seq_lens[1] = -1"),
            std::string::npos);
  const std::vector<int32_t> two{5, 6};
  EXPECT_NE(error_of([&] {
              plan_balanced_decode(two.data(), 2, -1, 4, 128, 1, items.data(), offsets.data());
            }).find("room for 1 work items but 2 sequences"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              plan_balanced_decode(two.data(), 2, -1, 0, 128, 10, items.data(), offsets.data());
            }).find("target_items"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              plan_balanced_decode(two.data(), 2, -1, 4, 16, 10, items.data(), offsets.data());
            }).find("min_chunk"),
            std::string::npos);
}

}  // namespace
}  // namespace pagedkv
