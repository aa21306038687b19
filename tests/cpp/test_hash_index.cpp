// HashIndex (the prefix cache's open-addressing table): random put/erase against std::map,
// with keys crowded into few home slots so that probe runs wrap and backward shifts happen.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <utility>

#include "core/hash_index.h"

namespace pagedkv::detail {
namespace {

TEST(HashIndex, MatchesStdMapUnderCollisionsAndWraparound) {
  std::mt19937_64 rng(5);
  HashIndex index(24);  // capacity 64
  std::map<std::pair<uint64_t, uint64_t>, int32_t> ref;
  for (int step = 0; step < 200000; ++step) {
    // lo mostly lands on home slots 60..63 and 0..3 (the table wraps there).
    BlockHash h{(rng() % 8 + 60) % 64 + 64 * (rng() % 4), rng() % 3};
    auto key = std::make_pair(h.lo, h.hi);
    if (rng() % 2 && ref.size() < 24) {
      int32_t v = static_cast<int32_t>(rng() % 1000);
      index.put(h, v);
      ref[key] = v;
    } else {
      index.erase(h);
      ref.erase(key);
    }
    ASSERT_EQ(index.size(), ref.size());
    if (step % 97 == 0) {
      for (const auto& kv : ref)
        ASSERT_EQ(index.find(BlockHash{kv.first.first, kv.first.second}), kv.second);
      size_t seen = 0;
      index.for_each([&](const BlockHash& k, int32_t v) {
        ++seen;
        ASSERT_EQ(ref.at({k.lo, k.hi}), v);
      });
      ASSERT_EQ(seen, ref.size());
    }
    ASSERT_EQ(index.find(h), ref.count(key) ? ref[key] : HashIndex::kNone);
  }
  index.clear();
  EXPECT_EQ(index.size(), 0u);
  EXPECT_EQ(index.find(BlockHash{60, 0}), HashIndex::kNone);
}

}  // namespace
}  // namespace pagedkv::detail
