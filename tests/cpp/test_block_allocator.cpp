// BlockAllocator: pool, ref counts, copy-on-write, host swap pool, prefix cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace pagedkv {
namespace {

using Pair = std::pair<int64_t, int64_t>;

BlockAllocatorConfig config(int32_t n, int32_t bs, int32_t cpu = 0, bool prefix = true) {
  BlockAllocatorConfig c;
  c.num_blocks = n;
  c.block_size = bs;
  c.num_cpu_blocks = cpu;
  c.enable_prefix_caching = prefix;
  return c;
}

// Allocates one block per full block of `tokens`, registers them as a chain, returns the ids.
std::vector<BlockId> cache_sequence(BlockAllocator& a, const std::vector<int32_t>& tokens,
                                    uint64_t extra = 0) {
  const int32_t bs = a.block_size();
  std::vector<BlockId> ids;
  EXPECT_EQ(a.allocate(static_cast<int32_t>(tokens.size() / bs), &ids), Status::kOk);
  BlockHash h = kRootHash;
  for (size_t i = 0; i < ids.size(); ++i) h = a.cache_full_block(ids[i], h, &tokens[i * bs], extra);
  return ids;
}

TEST(BlockAllocator, AllocateFreeIsAllOrNothing) {
  BlockAllocator a(config(8, 4));
  std::vector<BlockId> ids;
  ASSERT_EQ(a.allocate(5, &ids), Status::kOk);
  EXPECT_EQ(std::set<BlockId>(ids.begin(), ids.end()).size(), 5u);
  EXPECT_EQ(a.num_free_blocks(), 3);
  EXPECT_EQ(a.num_used_blocks(), 5);
  std::vector<BlockId> more;
  EXPECT_EQ(a.allocate(4, &more), Status::kOutOfBlocks);
  EXPECT_TRUE(more.empty());
  EXPECT_EQ(a.num_free_blocks(), 3);
  EXPECT_EQ(a.allocate(-1, &more), Status::kInvalidArgument);
  ASSERT_EQ(a.free(ids.data(), ids.size()), Status::kOk);
  EXPECT_EQ(a.num_free_blocks(), 8);
  EXPECT_EQ(a.check_invariants(), "");
}

TEST(BlockAllocator, DoubleFreeAndBadIdsChangeNothing) {
  BlockAllocator a(config(4, 2));
  std::vector<BlockId> ids;
  ASSERT_EQ(a.allocate(2, &ids), Status::kOk);
  BlockId twice[2] = {ids[0], ids[0]};
  EXPECT_EQ(a.free(twice, 2), Status::kNotAllocated);  // ref 1, listed twice
  EXPECT_EQ(a.ref_count(ids[0]), 1);
  BlockId bad[2] = {ids[1], 7};
  EXPECT_EQ(a.free(bad, 2), Status::kInvalidBlock);
  EXPECT_EQ(a.ref_count(ids[1]), 1);
  BlockId neg = -3;
  EXPECT_EQ(a.fork(&neg, 1), Status::kInvalidBlock);
  EXPECT_EQ(a.ref_count(-3), -1);
  ASSERT_EQ(a.free(ids.data(), 2), Status::kOk);
  EXPECT_EQ(a.free(ids.data(), 1), Status::kNotAllocated);
  EXPECT_EQ(a.fork(ids.data(), 1), Status::kNotAllocated);
  EXPECT_EQ(a.check_invariants(), "");
  EXPECT_THROW(BlockAllocator(config(-1, 4)), ValueError);
  EXPECT_THROW(BlockAllocator(config(4, 0)), ValueError);
}

TEST(BlockAllocator, ForkSharesAndCopyOnWriteSplits) {
  BlockAllocator a(config(4, 4, 0, /*prefix=*/false));
  std::vector<BlockId> ids;
  ASSERT_EQ(a.allocate(1, &ids), Status::kOk);
  BlockId b = ids[0];
  ASSERT_EQ(a.fork(&b, 1), Status::kOk);
  EXPECT_EQ(a.ref_count(b), 2);
  BlockId w = b;
  bool copied = false;
  ASSERT_EQ(a.copy_on_write(&w, &copied), Status::kOk);
  EXPECT_TRUE(copied);
  EXPECT_NE(w, b);
  EXPECT_EQ(a.ref_count(b), 1);
  EXPECT_EQ(a.ref_count(w), 1);
  auto copies = a.take_pending_copies();
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0], Pair(b, w));
  EXPECT_TRUE(a.take_pending_copies().empty());
  // A private block is written in place.
  BlockId w2 = w;
  ASSERT_EQ(a.copy_on_write(&w2, &copied), Status::kOk);
  EXPECT_FALSE(copied);
  EXPECT_EQ(w2, w);
  EXPECT_EQ(a.counters().cow_copies, 1);
}

TEST(BlockAllocator, CopyOnWriteOutOfBlocksChangesNothing) {
  BlockAllocator a(config(1, 4, 0, false));
  std::vector<BlockId> ids;
  ASSERT_EQ(a.allocate(1, &ids), Status::kOk);
  ASSERT_EQ(a.fork(ids.data(), 1), Status::kOk);
  BlockId w = ids[0];
  bool copied = true;
  EXPECT_EQ(a.copy_on_write(&w, &copied), Status::kOutOfBlocks);
  EXPECT_EQ(w, ids[0]);
  EXPECT_FALSE(copied);
  EXPECT_EQ(a.ref_count(ids[0]), 2);
}

TEST(BlockAllocator, SwapRoundTrip) {
  BlockAllocator a(config(4, 4, 3));
  std::vector<BlockId> ids, cpu, back;
  std::vector<std::pair<int64_t, int64_t>> out_map, in_map;
  ASSERT_EQ(a.allocate(3, &ids), Status::kOk);
  ASSERT_EQ(a.swap_out(ids.data(), 3, &cpu, &out_map), Status::kOk);
  EXPECT_EQ(a.num_free_blocks(), 4);
  EXPECT_EQ(a.num_free_cpu_blocks(), 0);
  ASSERT_EQ(out_map.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(out_map[i], Pair(ids[i], cpu[i]));
  std::vector<BlockId> one, more_cpu;
  EXPECT_EQ(a.swap_out(ids.data(), 1, &more_cpu, &out_map), Status::kNotAllocated);  // bad id first
  ASSERT_EQ(a.allocate(1, &one), Status::kOk);
  EXPECT_EQ(a.swap_out(one.data(), 1, &more_cpu, &out_map), Status::kOutOfBlocks);
  EXPECT_EQ(a.ref_count(one[0]), 1);
  ASSERT_EQ(a.free(one.data(), 1), Status::kOk);
  ASSERT_EQ(a.swap_in(cpu.data(), 3, &back, &in_map), Status::kOk);
  EXPECT_EQ(a.num_free_cpu_blocks(), 3);
  EXPECT_EQ(a.num_used_blocks(), 3);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(in_map[i], Pair(cpu[i], back[i]));
  EXPECT_EQ(a.swap_in(cpu.data(), 1, &back, &in_map), Status::kNotAllocated);
  EXPECT_EQ(a.check_invariants(), "");
}

TEST(BlockHashTest, ChainedAndSensitiveToEveryInput) {
  std::vector<int32_t> t{1, 2, 3, 4};
  BlockHash h = hash_block(kRootHash, t.data(), 4);
  EXPECT_EQ(h, hash_block(kRootHash, t.data(), 4));
  EXPECT_NE(h, hash_block(kRootHash, t.data(), 4, 1));  // extra key
  EXPECT_NE(h, hash_block(h, t.data(), 4));             // parent
  EXPECT_NE(h, hash_block(kRootHash, t.data(), 3));     // length
  std::vector<int32_t> u{1, 2, 4, 3};
  EXPECT_NE(h, hash_block(kRootHash, u.data(), 4));  // order
  // No collisions over many random small blocks (each lane alone would need 2^32 for one).
  std::mt19937 rng(7);
  std::set<std::pair<uint64_t, uint64_t>> seen;
  for (int i = 0; i < 20000; ++i) {
    int32_t v[2] = {static_cast<int32_t>(rng() % 50), static_cast<int32_t>(rng() % 50000)};
    BlockHash x = hash_block(kRootHash, v, 2, rng() % 3);
    seen.insert({x.lo, x.hi});
  }
  EXPECT_GT(seen.size(), 19000u);  // duplicates only from repeated inputs
}

TEST(PrefixCache, SecondPromptReusesFullBlocks) {
  BlockAllocator a(config(16, 4));
  std::vector<int32_t> p(10);
  std::iota(p.begin(), p.end(), 100);
  auto ids = cache_sequence(a, p);  // 2 full blocks
  ASSERT_EQ(ids.size(), 2u);
  ASSERT_EQ(a.free(ids.data(), ids.size()), Status::kOk);
  EXPECT_EQ(a.num_cached_free_blocks(), 2);
  EXPECT_EQ(a.num_free_blocks(), 16);
  std::vector<int32_t> q(p.begin(), p.begin() + 8);
  q.push_back(5);
  std::vector<BlockId> got;
  std::vector<BlockHash> hashes;
  EXPECT_EQ(a.peek_prefix(q.data(), q.size(), 0, -1), 2);
  EXPECT_EQ(a.match_prefix(q.data(), q.size(), 0, -1, &got, &hashes), 2);
  EXPECT_EQ(got, ids);
  EXPECT_EQ(a.ref_count(ids[0]), 1);
  EXPECT_EQ(a.num_cached_free_blocks(), 0);
  EXPECT_EQ(a.counters().prefix_queries_tokens, 9);
  EXPECT_EQ(a.counters().prefix_hits_tokens, 8);
  // Capped, and a different extra key misses.
  std::vector<BlockId> got2;
  EXPECT_EQ(a.match_prefix(q.data(), q.size(), 0, 1, &got2, nullptr), 1);
  EXPECT_EQ(a.match_prefix(q.data(), q.size(), 9, -1, &got2, nullptr), 0);
  EXPECT_EQ(a.ref_count(ids[0]), 2);
  EXPECT_EQ(a.check_invariants(), "");
}

TEST(PrefixCache, EvictsLeastRecentlyFreedTailFirst) {
  BlockAllocator a(config(4, 2));
  std::vector<int32_t> p{1, 2, 3, 4, 5, 6, 7, 8};
  auto ids = cache_sequence(a, p);
  ASSERT_EQ(a.free(ids.data(), ids.size()), Status::kOk);
  EXPECT_EQ(a.num_cached_free_blocks(), 4);
  std::vector<BlockId> one;
  ASSERT_EQ(a.allocate(1, &one), Status::kOk);
  EXPECT_EQ(one[0], ids[3]);  // the chain's tail goes first
  EXPECT_EQ(a.counters().evictions, 1);
  std::vector<BlockId> got;
  EXPECT_EQ(a.match_prefix(p.data(), p.size(), 0, -1, &got, nullptr), 3);
  EXPECT_EQ(a.check_invariants(), "");
}

TEST(PrefixCache, UncachedFreeBlocksAreReusedBeforeCachedOnes) {
  BlockAllocator a(config(4, 2));
  std::vector<int32_t> p{1, 2, 3, 4};
  auto cached = cache_sequence(a, p);
  std::vector<BlockId> plain;
  ASSERT_EQ(a.allocate(2, &plain), Status::kOk);
  ASSERT_EQ(a.free(cached.data(), 2), Status::kOk);
  ASSERT_EQ(a.free(plain.data(), 2), Status::kOk);  // freed later, but uncached
  std::vector<BlockId> got;
  ASSERT_EQ(a.allocate(2, &got), Status::kOk);
  EXPECT_EQ(std::set<BlockId>(got.begin(), got.end()),
            std::set<BlockId>(plain.begin(), plain.end()));
  EXPECT_EQ(a.counters().evictions, 0);
}

TEST(PrefixCache, DuplicatesStayUncachedAndCollisionsCannotHit) {
  BlockAllocator a(config(8, 2));
  std::vector<int32_t> p{3, 4};
  auto first = cache_sequence(a, p);
  auto second = cache_sequence(a, p);
  EXPECT_EQ(a.num_cached_blocks(), 1);
  BlockHash h;
  EXPECT_TRUE(a.cached_hash(first[0], &h));
  EXPECT_FALSE(a.cached_hash(second[0], nullptr));
  // Re-registering with other content is refused.
  std::vector<int32_t> other{9, 9};
  EXPECT_EQ(a.try_cache_full_block(first[0], kRootHash, other.data(), 0, &h),
            Status::kInvalidArgument);
  EXPECT_THROW(a.cache_full_block(42, kRootHash, other.data()), ValueError);
}

// Seed 002 at the allocator level: block_size 1, a 7-token prompt cached, a 12-token prompt sharing
// it reuses 7 tokens and computes 5.
TEST(PrefixCache, Seed002TokenGranularReuse) {
  BlockAllocator a(config(64, 1));
  std::vector<int32_t> first{101, 102, 103, 104, 105, 106, 107};
  auto ids = cache_sequence(a, first);
  ASSERT_EQ(a.free(ids.data(), ids.size()), Status::kOk);
  std::vector<int32_t> second = first;
  for (int32_t t : {201, 202, 203, 204, 205}) second.push_back(t);
  std::vector<BlockId> got;
  // The scheduler caps at prompt - 1 so the last token is recomputed; 7 < 11 anyway.
  int32_t hit = a.match_prefix(second.data(), second.size(), 0, 11, &got, nullptr);
  EXPECT_EQ(hit, 7);
  EXPECT_EQ(got, ids);
  EXPECT_EQ(static_cast<int32_t>(second.size()) - hit, 5);
}

TEST(PrefixCache, PartialBlockReuseByCopy) {
  BlockAllocator a(config(8, 4));
  std::vector<int32_t> p{1, 2, 3, 4, 5, 6, 7, 8};
  auto ids = cache_sequence(a, p);
  ASSERT_EQ(a.free(ids.data(), ids.size()), Status::kOk);
  std::vector<int32_t> q{1, 2, 3, 4, 5, 6, 9, 9, 9};  // 6 cached tokens: 1 block + 2 tokens
  std::vector<BlockId> got;
  EXPECT_EQ(a.match_prefix_tokens(q.data(), q.size(), 0, -1, &got, nullptr), 6);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], ids[0]);
  EXPECT_NE(got[1], ids[1]);
  EXPECT_EQ(a.ref_count(got[1]), 1);
  EXPECT_EQ(a.ref_count(ids[1]), 1);  // kept until the copy is taken
  auto copies = a.take_pending_copies();
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0], Pair(ids[1], got[1]));
  EXPECT_EQ(a.ref_count(ids[1]), 0);  // then the source stays cached and free
  EXPECT_EQ(a.num_cached_free_blocks(), 1);
  EXPECT_EQ(a.counters().partial_hit_tokens, 2);
  EXPECT_EQ(a.counters().prefix_hits_tokens, 6);
  // max_tokens caps the partial part too.
  std::vector<BlockId> got2;
  EXPECT_EQ(a.match_prefix_tokens(q.data(), q.size(), 0, 5, &got2, nullptr), 5);
  EXPECT_EQ(a.check_invariants(), "");
}

TEST(PrefixCache, ManySiblingsEvictInO1AndPartialFindsRecentOnes) {
  BlockAllocator a(config(300, 4));
  std::mt19937 rng(3);
  std::vector<std::vector<int32_t>> blocks;
  for (int i = 0; i < 200; ++i) {  // 200 cached children of the root
    blocks.push_back({i, static_cast<int32_t>(rng() % 9), 5, 6});
    auto ids = cache_sequence(a, blocks.back());
    ASSERT_EQ(a.free(ids.data(), 1), Status::kOk);
  }
  EXPECT_EQ(a.num_cached_blocks(), 200);
  std::vector<int32_t> q{199, blocks[199][1], 5, 0, 0};  // 3 tokens of the newest child
  std::vector<BlockId> got;
  EXPECT_EQ(a.match_prefix_tokens(q.data(), q.size(), 0, -1, &got, nullptr), 3);
  ASSERT_EQ(a.free(got.data(), got.size()), Status::kOk);
  ASSERT_EQ(a.take_pending_copies().size(), 1u);  // releases the source
  std::vector<BlockId> all;  // evicts every cached block (siblings removed from the index)
  ASSERT_EQ(a.allocate(300, &all), Status::kOk);
  EXPECT_EQ(a.num_cached_blocks(), 0);
  EXPECT_EQ(a.counters().evictions, 200);
  EXPECT_EQ(a.check_invariants(), "");
}

}  // namespace
}  // namespace pagedkv

namespace pagedkv {
namespace {

// Random operations with full structural checks after each (the Python stateful test compares
// against an exact model; this one keeps the C++ suite self-sufficient): ref counts equal the
// references the test holds, nothing is handed out twice, matched blocks hold the prompt.
TEST(BlockAllocatorFuzz, RandomOperationsKeepInvariants) {
  std::mt19937 rng(11);
  for (int32_t bs : {1, 4}) {
    BlockAllocator a(config(48, bs, 8));
    std::vector<std::vector<BlockId>> seqs;
    std::vector<std::vector<int32_t>> contents(48);  // tokens each cached block was cached with
    for (int step = 0; step < 4000; ++step) {
      int op = rng() % 5;
      if (op == 0) {  // prompt: match, allocate the rest, register full blocks
        std::vector<int32_t> p(1 + rng() % (6 * bs));
        for (auto& t : p) t = rng() % 3;
        std::vector<BlockId> ids;
        std::vector<BlockHash> hs;
        int32_t m = a.match_prefix(p.data(), p.size(), 0, (p.size() - 1) / bs, &ids, &hs);
        for (int32_t i = 0; i < m; ++i)
          ASSERT_EQ(contents[ids[i]],
                    std::vector<int32_t>(p.begin() + i * bs, p.begin() + (i + 1) * bs));
        int32_t need = static_cast<int32_t>((p.size() + bs - 1) / bs) - m;
        if (a.allocate(need, &ids) != Status::kOk) {
          ASSERT_EQ(a.free(ids.data(), ids.size()), Status::kOk);
          continue;
        }
        BlockHash h = m ? hs.back() : kRootHash;
        for (size_t i = m; i < p.size() / bs; ++i) {
          const int32_t* t = &p[i * bs];
          h = a.cache_full_block(ids[i], h, t);
          if (a.cached_hash(ids[i], nullptr)) contents[ids[i]].assign(t, t + bs);
        }
        seqs.push_back(ids);
      } else if (op == 1 && !seqs.empty()) {  // finish
        size_t i = rng() % seqs.size();
        ASSERT_EQ(a.free(seqs[i].data(), seqs[i].size()), Status::kOk);
        seqs.erase(seqs.begin() + i);
      } else if (op == 2 && !seqs.empty()) {  // fork
        auto s = seqs[rng() % seqs.size()];
        ASSERT_EQ(a.fork(s.data(), s.size()), Status::kOk);
        seqs.push_back(s);
      } else if (op == 3 && !seqs.empty() && !seqs.back().empty()) {  // copy-on-write
        BlockId& b = seqs.back()[rng() % seqs.back().size()];
        bool copied = false;
        Status s = a.copy_on_write(&b, &copied);
        ASSERT_TRUE(s == Status::kOk || s == Status::kOutOfBlocks);
        a.take_pending_copies();
      } else if (op == 4 && !seqs.empty()) {  // swap out and back in
        size_t i = rng() % seqs.size();
        std::vector<BlockId> cpu, back;
        std::vector<std::pair<int64_t, int64_t>> map;
        if (a.swap_out(seqs[i].data(), seqs[i].size(), &cpu, &map) != Status::kOk) continue;
        if (a.swap_in(cpu.data(), cpu.size(), &back, &map) != Status::kOk) {
          ASSERT_EQ(a.free_cpu(cpu.data(), cpu.size()), Status::kOk);
          seqs.erase(seqs.begin() + i);
        } else {
          seqs[i] = back;
        }
      }
      std::vector<int32_t> held(48, 0);
      for (const auto& s : seqs)
        for (BlockId b : s) ++held[b];
      for (BlockId b = 0; b < 48; ++b) ASSERT_EQ(a.ref_count(b), held[b]) << "block " << b;
      ASSERT_EQ(a.num_free_cpu_blocks(), 8);
      ASSERT_EQ(a.check_invariants(), "");
    }
    for (auto& s : seqs) ASSERT_EQ(a.free(s.data(), s.size()), Status::kOk);
    EXPECT_EQ(a.num_free_blocks(), 48);
    // The run exercised the interesting paths.
    EXPECT_GT(a.counters().prefix_hits_tokens, 50);
    EXPECT_GT(a.counters().evictions, 100);
    EXPECT_GT(a.counters().cow_copies, 10);
    EXPECT_GT(a.counters().swapped_in_blocks, 100);
  }
}

}  // namespace
}  // namespace pagedkv
