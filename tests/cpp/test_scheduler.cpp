// Scheduler: the seed traces, the metadata contract, budgets, preemption (both modes), aborts,
// priorities, fork / copy-on-write, bad input, and no leaked block.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "pagedkv/pagedkv.h"
#include "scheduler_test_util.h"

namespace pagedkv {
namespace {

using testing::Driver;
using testing::random_tokens;

SchedulerConfig make_config(int32_t num_blocks, int32_t block_size, int32_t budget = 2048,
                            int32_t max_seqs = 256) {
  SchedulerConfig c;
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  return c;
}

RequestParams max_tokens(int32_t n) {
  RequestParams p;
  p.max_tokens = n;
  return p;
}

// Seed 000: two 484-token prompts under a 512-token budget, block size 16.
TEST(Scheduler, Seed000ChunkedPrefillTrace) {
  Scheduler s(make_config(1000, 16, 512));
  std::mt19937 rng(0);
  s.add_request("a", random_tokens(rng, 484), max_tokens(10));
  s.add_request("b", random_tokens(rng, 484), max_tokens(10));

  const StepPlan& p1 = s.schedule();
  EXPECT_EQ(p1.num_prefills, 2);
  EXPECT_EQ(p1.num_prefill_tokens, 512);
  EXPECT_EQ(p1.num_decode_tokens, 0);
  EXPECT_EQ(std::vector<int32_t>(p1.seq_lens.begin(), p1.seq_lens.begin() + 2),
            (std::vector<int32_t>{484, 28}));
  EXPECT_EQ(std::vector<int32_t>(p1.query_start_loc.begin(), p1.query_start_loc.begin() + 3),
            (std::vector<int32_t>{0, 484, 512}));
  EXPECT_EQ(p1.max_query_len, 484);
  EXPECT_EQ(p1.max_prefill_seq_len, 484);
  EXPECT_EQ(p1.max_decode_seq_len, 0);
  EXPECT_EQ(p1.sample_indices[0], 483);
  EXPECT_EQ(p1.sample_indices[1], -1);
  s.update(p1, {100, -1});

  const StepPlan& p2 = s.schedule();
  EXPECT_EQ(p2.num_seqs, 2);
  EXPECT_EQ(p2.num_prefills, 1);
  EXPECT_EQ(p2.num_prefill_tokens, 456);
  EXPECT_EQ(p2.num_decode_tokens, 1);
  EXPECT_EQ(s.request_id(p2.slots[0]), "b");  // prefills first
  EXPECT_EQ(s.request_id(p2.slots[1]), "a");
  EXPECT_EQ(p2.seq_lens[0], 484);
  EXPECT_EQ(p2.seq_lens[1], 485);
  EXPECT_EQ(p2.context_lens[0], 28);
  EXPECT_EQ(p2.context_lens[1], 484);
  EXPECT_EQ(p2.query_start_loc[1], 456);
  EXPECT_EQ(p2.query_start_loc[2], 457);
  EXPECT_EQ(p2.seq_start_loc[2], 969);
  EXPECT_EQ(p2.max_query_len, 456);
  EXPECT_EQ(p2.max_prefill_seq_len, 484);
  EXPECT_EQ(p2.max_decode_seq_len, 485);
  EXPECT_EQ(p2.input_ids[456], 100);  // a's sampled token is fed back
  s.update(p2, {200, 101});

  const StepPlan& p3 = s.schedule();
  EXPECT_EQ(p3.num_prefills, 0);
  EXPECT_EQ(p3.num_decode_tokens, 2);
  EXPECT_EQ(p3.max_query_len, 1);
  EXPECT_EQ(p3.max_decode_seq_len, 486);
  std::vector<int32_t> lens(p3.seq_lens.begin(), p3.seq_lens.begin() + 2);
  std::sort(lens.begin(), lens.end());
  EXPECT_EQ(lens, (std::vector<int32_t>{485, 486}));
  EXPECT_EQ(p3.seq_start_loc[2], 971);
  for (const StepPlan* p : {&p3}) {
    for (int32_t i = 0; i < p->num_seqs; ++i) {
      for (int32_t t = p->query_start_loc[i]; t < p->query_start_loc[i + 1]; ++t) {
        int64_t pos = p->positions[t];
        EXPECT_EQ(p->slot_mapping[t], int64_t{p->block_table_row(i)[pos / 16]} * 16 + pos % 16);
      }
    }
  }
  s.update(p3, {1, 2});
  EXPECT_TRUE(s.abort_request("a"));
  EXPECT_TRUE(s.abort_request("b"));
  EXPECT_EQ(s.num_free_blocks(), 1000);
}

// Seed 002: with block_size 1 a 12-token prompt sharing 7 cached tokens extends only 5.
TEST(Scheduler, Seed002TokenGranularPrefixReuse) {
  Scheduler s(make_config(64, 1));
  std::vector<int32_t> first = {1, 29871, 29896, 29906, 29941, 29946, 29945};
  std::vector<int32_t> second = first;
  second.insert(second.end(), {29896, 29906, 29941, 29946, 29945});
  s.add_request("first", first, max_tokens(1));
  const StepPlan& p1 = s.schedule();
  EXPECT_EQ(s.update(p1, {5}), std::vector<std::string>{"first"});

  s.add_request("second", second, max_tokens(1));
  const StepPlan& p2 = s.schedule();
  ASSERT_EQ(p2.num_seqs, 1);
  EXPECT_EQ(p2.context_lens[0], 7);
  EXPECT_EQ(p2.seq_lens[0], 12);
  EXPECT_EQ(p2.num_prefill_tokens, 5);
  EXPECT_EQ(std::vector<int64_t>(p2.positions.begin(), p2.positions.begin() + 5),
            (std::vector<int64_t>{7, 8, 9, 10, 11}));
  EXPECT_EQ(s.counters().prefix_cache_hit_tokens, 7);
  s.update(p2, {3});
  EXPECT_EQ(s.num_free_blocks(), 64);
}

TEST(Scheduler, FullyCachedPromptRecomputesLastToken) {
  Scheduler s(make_config(64, 4));
  std::vector<int32_t> prompt = {11, 12, 13, 14, 15, 16, 17, 18};
  Driver d(s);
  d.add("a", prompt, max_tokens(1));
  d.run_to_end();
  d.add("b", prompt, max_tokens(2));
  const StepPlan& p = s.schedule();
  EXPECT_EQ(p.num_prefills, 1);
  EXPECT_EQ(p.context_lens[0], 4);  // capped at prompt - 1, rounded down to whole blocks
  EXPECT_EQ(p.sample_indices[0], p.num_tokens - 1);
  s.update(p, {9});
  d.abort("b");
  EXPECT_EQ(s.num_free_blocks(), 64);
}

TEST(Scheduler, RandomTracesKeepEveryTokenAndLeakNothing) {
  for (PreemptionMode mode : {PreemptionMode::kRecompute, PreemptionMode::kSwap}) {
    for (uint32_t seed = 0; seed < 6; ++seed) {
      std::mt19937 rng(seed);
      SchedulerConfig c = make_config(48, 4, 64, 8);
      c.preemption_mode = mode;
      c.num_cpu_blocks = mode == PreemptionMode::kSwap ? 40 : 0;
      c.enable_prefix_caching = seed % 2 == 0;
      c.enable_chunked_prefill = seed % 3 != 2;
      c.max_model_len = 64;
      Scheduler s(c);
      Driver d(s, seed);
      d.eos_rate = 0.02;
      int next = 0;
      std::vector<int32_t> shared = random_tokens(rng, 16);
      for (int step = 0; step < 400 || s.has_unfinished_requests(); ++step) {
        ASSERT_LT(step, 20000);
        if (step < 400 && rng() % 3 == 0) {
          int32_t len = 1 + static_cast<int32_t>(rng() % 40);
          std::vector<int32_t> prompt = random_tokens(rng, len);
          if (rng() % 2)
            std::copy(shared.begin(), shared.begin() + std::min(len, 16), prompt.begin());
          RequestParams p = max_tokens(1 + static_cast<int32_t>(rng() % 20));
          p.eos_token_ids = {d.eos};
          d.add("r" + std::to_string(next++), prompt, p);
        }
        if (step < 400 && rng() % 17 == 0 && next > 0) {
          std::string id = "r" + std::to_string(rng() % next);
          if (s.has_request(id)) d.abort(id);
        }
        d.step();
        if (HasFatalFailure() || HasFailure()) return;
      }
      EXPECT_EQ(s.num_free_blocks(), c.num_blocks) << "leaked blocks";
      EXPECT_EQ(s.allocator().num_used_blocks(), 0);
      EXPECT_EQ(s.allocator().num_free_cpu_blocks(), c.num_cpu_blocks);
      if (seed == 0) EXPECT_GT(s.counters().num_preemptions, 0) << "trace too easy";
    }
  }
}

// Many long decodes in a cache far too small: preemptions happen, nothing is lost, every request
// ends with exactly max_tokens tokens, and a resumed request is not preempted again at once.
TEST(Scheduler, PreemptionStormLosesNothing) {
  for (PreemptionMode mode : {PreemptionMode::kRecompute, PreemptionMode::kSwap}) {
    SchedulerConfig c = make_config(40, 4, 256, 32);
    c.preemption_mode = mode;
    c.num_cpu_blocks = 64;
    Scheduler s(c);
    Driver d(s, 1);
    std::mt19937 rng(1);
    for (int i = 0; i < 24; ++i)
      d.add("r" + std::to_string(i), random_tokens(rng, 8), max_tokens(40));
    int steps = 0;
    while (s.has_unfinished_requests()) {
      ASSERT_LT(++steps, 5000);
      d.step();
      if (HasFatalFailure()) return;
    }
    EXPECT_GT(s.counters().num_preemptions, 5);
    EXPECT_LT(s.counters().num_preemptions, 400) << "preemption storm";
    ASSERT_EQ(d.finished().size(), 24u);
    for (auto& [id, toks] : d.finished()) EXPECT_EQ(toks.size(), 48u) << id;
    EXPECT_EQ(s.num_free_blocks(), 40);
  }
}

TEST(Scheduler, PriorityPolicyAdmitsAndKeepsHighPriorityFirst) {
  SchedulerConfig c = make_config(12, 4, 64, 2);
  c.policy = SchedulingPolicy::kPriority;
  Scheduler s(c);
  Driver d(s);
  std::mt19937 rng(3);
  RequestParams low = max_tokens(8), high = max_tokens(8);
  low.priority = 5;
  high.priority = -1;
  d.add("low1", random_tokens(rng, 8), low);
  d.add("low2", random_tokens(rng, 8), low);
  d.add("high", random_tokens(rng, 8), high);
  std::vector<std::string> first = d.step();
  EXPECT_NE(std::find(first.begin(), first.end(), "high"), first.end());
  EXPECT_EQ(first.size(), 2u);
  d.run_to_end();
  EXPECT_EQ(s.num_free_blocks(), 12);
}

TEST(Scheduler, PreemptionPicksLatestArrivalAndRequeuesItFirst) {
  Scheduler s(make_config(6, 4, 64));
  Driver d(s);
  std::mt19937 rng(4);
  d.add("a", random_tokens(rng, 8), max_tokens(12));
  d.add("b", random_tokens(rng, 8), max_tokens(12));
  d.step();  // both prefilled: 2 + 2 blocks, then grow
  int64_t before = s.counters().num_preemptions;
  while (s.counters().num_preemptions == before) d.step();
  EXPECT_TRUE(s.get_num_generated("a") >= s.get_num_generated("b"));
  EXPECT_EQ(s.num_waiting(), 1);
  EXPECT_EQ(s.num_running(), 1);
  d.add("c", random_tokens(rng, 4), max_tokens(1));
  d.run_to_end();
  EXPECT_EQ(s.num_free_blocks(), 6);
}

TEST(Scheduler, ForkSharesPromptBlocksAndCopiesOnWrite) {
  Scheduler s(make_config(32, 4));
  std::vector<int32_t> prompt = {11, 12, 13, 14, 15, 16};  // 1.5 blocks
  RequestParams p = max_tokens(3);
  s.add_request("p", prompt, p);
  const StepPlan& p1 = s.schedule();
  s.update(p1, {50});
  int32_t free_before = s.num_free_blocks();
  EXPECT_EQ(s.fork("p", "c", 60).reason, FinishReason::kNone);
  EXPECT_EQ(s.num_free_blocks(), free_before);  // shared, nothing new
  EXPECT_EQ(s.get_token_ids("c"), (std::vector<int32_t>{11, 12, 13, 14, 15, 16, 60}));
  const StepPlan& p2 = s.schedule();
  ASSERT_EQ(p2.num_seqs, 2);
  ASSERT_EQ(p2.blocks_to_copy.size(), 1u);  // the shared partial block, copied once
  EXPECT_EQ(p2.block_table_row(0)[0], p2.block_table_row(1)[0]);  // full block still shared
  EXPECT_NE(p2.block_table_row(0)[1], p2.block_table_row(1)[1]);
  int64_t src = p2.blocks_to_copy[0].first, dst = p2.blocks_to_copy[0].second;
  EXPECT_TRUE((p2.block_table_row(0)[1] == dst) != (p2.block_table_row(1)[1] == dst));
  EXPECT_TRUE(p2.block_table_row(0)[1] == src || p2.block_table_row(1)[1] == src);
  s.update(p2, {51, 61});
  EXPECT_THROW(s.fork("p", "y", 1), ValueError);
  RequestParams one = max_tokens(1);
  s.add_request("q", prompt, one);
  const StepPlan& p3 = s.schedule();
  std::vector<int64_t> sampled(p3.num_seqs, 1);
  s.update(p3, sampled);
  while (s.has_unfinished_requests()) {
    const StepPlan& pp = s.schedule();
    s.update(pp, std::vector<int64_t>(pp.num_seqs, 1));
  }
  EXPECT_EQ(s.num_free_blocks(), 32);
}

TEST(Scheduler, ForkedChildFinishingAtOnceIsFreed) {
  Scheduler s(make_config(32, 4));
  RequestParams p = max_tokens(4);
  p.eos_token_ids = {2};
  s.add_request("p", std::vector<int32_t>{5, 6, 7}, p);
  s.update(s.schedule(), {9});
  EXPECT_EQ(s.fork("p", "c", 2).reason, FinishReason::kEos);
  EXPECT_FALSE(s.has_request("c"));
  EXPECT_TRUE(s.abort_request("p"));
  EXPECT_EQ(s.num_free_blocks(), 32);
}

TEST(Scheduler, NoChunkingMeansWholePrompts) {
  SchedulerConfig c = make_config(100, 4, 32);
  c.enable_chunked_prefill = false;
  Scheduler s(c);
  std::mt19937 rng(5);
  Driver d(s);
  d.add("a", random_tokens(rng, 20), max_tokens(3));
  d.add("b", random_tokens(rng, 20), max_tokens(3));
  d.step();
  const StepPlan& p = s.schedule();  // b could not fit step 1 (20 + 20 > 32)
  EXPECT_EQ(p.num_prefill_tokens, 20);
  EXPECT_EQ(p.num_decode_tokens, 1);
  s.update(p, {1, 1});
  d.abort("a");
  d.abort("b");
  EXPECT_THROW(s.add_request("big", random_tokens(rng, 40), max_tokens(1)), ValueError);
}

TEST(Scheduler, BadInputRaisesValueError) {
  EXPECT_THROW(Scheduler(make_config(0, 16)), ValueError);
  EXPECT_THROW(Scheduler(make_config(10, 0)), ValueError);
  SchedulerConfig swap = make_config(10, 16);
  swap.preemption_mode = PreemptionMode::kSwap;
  EXPECT_THROW({ Scheduler x(swap); }, ValueError);
  SchedulerConfig c = make_config(4, 4);
  c.max_model_len = 100;  // let the block check, not the length check, speak
  Scheduler s(c);
  EXPECT_THROW(s.add_request("e", std::vector<int32_t>{}, max_tokens(1)), ValueError);
  EXPECT_THROW(s.add_request("n", std::vector<int32_t>{1, -2}, max_tokens(1)), ValueError);
  EXPECT_THROW(s.add_request("z", std::vector<int32_t>{1}, max_tokens(0)), ValueError);
  // 14 + 4 - 1 = 17 tokens need 5 blocks of 4 > num_blocks: it could never run.
  EXPECT_THROW(s.add_request("big", std::vector<int32_t>(14, 1), max_tokens(4)), ValueError);
  s.add_request("ok", std::vector<int32_t>(13, 1), max_tokens(4));  // exactly 16 tokens cached
  EXPECT_THROW(s.add_request("ok", std::vector<int32_t>{1}, max_tokens(1)), ValueError);
  EXPECT_THROW(s.add_request("long", std::vector<int32_t>(90, 1), max_tokens(11)), ValueError);
  EXPECT_FALSE(s.abort_request("nope"));
  const StepPlan& p = s.schedule();
  EXPECT_THROW(s.schedule(), ValueError);  // previous plan not updated
  EXPECT_THROW(s.update(p, std::vector<int64_t>{}), ValueError);
  EXPECT_THROW(s.update(p, std::vector<int64_t>{-5}), ValueError);
  s.update(p, {3});
  EXPECT_THROW(s.update(p, {3}), ValueError);
  while (s.has_unfinished_requests()) s.update(s.schedule(), {3});
  EXPECT_EQ(s.num_free_blocks(), 4);
}

TEST(Scheduler, AbortBetweenScheduleAndUpdateIsSkipped) {
  Scheduler s(make_config(32, 4));
  s.add_request("a", std::vector<int32_t>{1, 2, 3}, max_tokens(5));
  s.add_request("b", std::vector<int32_t>{4, 5, 6}, max_tokens(5));
  const StepPlan& p = s.schedule();
  EXPECT_TRUE(s.abort_request("a"));
  EXPECT_TRUE(s.update(p, {9, 9}).empty());
  EXPECT_EQ(s.get_num_generated("b"), 1);
  EXPECT_TRUE(s.abort_request("b"));
  EXPECT_EQ(s.num_free_blocks(), 32);
}

}  // namespace
}  // namespace pagedkv

namespace pagedkv {
namespace {

TEST(Scheduler, ForkFromAParentThatJustFinished) {
  SchedulerConfig c;
  c.num_blocks = 32;
  c.block_size = 4;
  Scheduler s(c);
  RequestParams p;
  p.max_tokens = 3;
  p.eos_token_ids = {2};
  std::vector<int32_t> prompt = {11, 12, 13, 14, 15, 16, 17, 18, 19};
  s.add_request("p", prompt, p);
  EXPECT_EQ(s.update(s.schedule(), {2}), std::vector<std::string>{"p"});
  EXPECT_EQ(s.fork("p", "c1", 40).reason, FinishReason::kNone);
  EXPECT_EQ(s.fork("p", "c2", 41).reason,
            FinishReason::kNone);  // the finished parent's record outlives the first fork
  const StepPlan& plan = s.schedule();
  ASSERT_EQ(plan.num_seqs, 2);
  EXPECT_EQ(plan.num_prefills, 2);
  EXPECT_EQ(plan.context_lens[0], 8);  // two full blocks from the prefix cache
  EXPECT_EQ(plan.seq_lens[0], 10);
  EXPECT_EQ(plan.input_ids[plan.query_start_loc[1] - 1], 40);
  s.update(plan, {5, 6});
  EXPECT_EQ(s.get_token_ids("c2").back(), 6);
  EXPECT_THROW(s.fork("p", "c3", 1), ValueError);
  while (s.has_unfinished_requests()) {
    const StepPlan& q = s.schedule();
    s.update(q, std::vector<int64_t>(q.num_seqs, 5));
  }
  EXPECT_EQ(s.num_free_blocks(), 32);
}

}  // namespace
}  // namespace pagedkv
