// The scheduler as the one place that finishes sequences: EOS ids (several), stop ids,
// min_tokens and max_tokens, with the reason update() reports; and the overlapped protocol
// (advance(), schedule the next step, resolve()) ending every request exactly as update() does.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "pagedkv/pagedkv.h"
#include "scheduler_test_util.h"

namespace pagedkv {
namespace {

using testing::Driver;
using testing::random_tokens;

SchedulerConfig config(int32_t num_blocks, int32_t block_size, int32_t budget = 2048,
                       int32_t max_seqs = 256) {
  SchedulerConfig c;
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  return c;
}

RequestParams params(int32_t max_tokens, std::vector<int32_t> eos, std::vector<int32_t> stops,
                     int32_t min_tokens = 0, bool ignore_eos = false) {
  RequestParams p;
  p.max_tokens = max_tokens;
  p.eos_token_ids = std::move(eos);
  p.stop_token_ids = std::move(stops);
  p.min_tokens = min_tokens;
  p.ignore_eos = ignore_eos;
  return p;
}

// One decode step of single-entry plans: the finished list of feeding `token`.
std::vector<Finished> feed(Scheduler& s, int64_t token) {
  const StepPlan& p = s.schedule();
  std::vector<int64_t> sampled(static_cast<size_t>(p.num_seqs), token);
  return s.update(p, sampled.data(), sampled.size());
}

TEST(SchedulerFinish, EveryEosIdStopsAndReportsItsReason) {
  Scheduler s(config(64, 4));
  for (int32_t eos : {2, 5, 9}) {
    const std::string id = "r" + std::to_string(eos);
    s.add_request(id, std::vector<int32_t>{1, 2, 3}, params(8, {2, 5, 9}, {}));
    EXPECT_TRUE(feed(s, 11).empty());
    std::vector<Finished> done = feed(s, eos);
    ASSERT_EQ(done.size(), 1u) << eos;
    EXPECT_EQ(s.request_id(done[0].slot), id);
    EXPECT_EQ(done[0].reason, FinishReason::kEos);
    EXPECT_EQ(done[0].stop_token_id, -1);
    EXPECT_STREQ(finish_reason_name(done[0].reason), "stop");
  }
  EXPECT_EQ(s.num_free_blocks(), 64);
}

TEST(SchedulerFinish, StopIdsWinOverEosAndLengthButWaitForMinTokens) {
  Scheduler s(config(64, 4));
  s.add_request("a", std::vector<int32_t>{1, 2}, params(3, {5}, {5, 6}, 2));
  EXPECT_TRUE(feed(s, 5).empty());          // before min_tokens: neither stop nor EOS
  std::vector<Finished> done = feed(s, 5);  // a stop id that is also an EOS id: the stop id
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].reason, FinishReason::kStopToken);
  EXPECT_EQ(done[0].stop_token_id, 5);

  s.add_request("b", std::vector<int32_t>{1, 2}, params(2, {5}, {6}));
  feed(s, 11);
  done = feed(s, 6);  // the last allowed token is a stop id: "stop", not "length"
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].reason, FinishReason::kStopToken);

  s.add_request("c", std::vector<int32_t>{1, 2}, params(2, {5}, {6}, 0, true));
  EXPECT_TRUE(feed(s, 5).empty());  // ignore_eos
  done = feed(s, 5);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].reason, FinishReason::kLength);
  EXPECT_STREQ(finish_reason_name(done[0].reason), "length");
  EXPECT_EQ(s.num_free_blocks(), 64);
}

TEST(SchedulerFinish, WouldFinishAsksTheSameRule) {
  Scheduler s(config(64, 4));
  s.add_request("a", std::vector<int32_t>{1, 2}, params(2, {5, 7}, {6}, 1));
  EXPECT_EQ(s.would_finish("a", 5).reason, FinishReason::kEos);  // token 1 reaches min_tokens
  EXPECT_EQ(s.would_finish("a", 6).reason, FinishReason::kStopToken);
  EXPECT_EQ(s.would_finish("a", 3).reason, FinishReason::kNone);
  feed(s, 3);
  EXPECT_EQ(s.would_finish("a", 3).reason, FinishReason::kLength);
  EXPECT_THROW(s.would_finish("zz", 3), ValueError);
}

TEST(SchedulerFinish, OverlapDropsTheNextEntryOfASequenceThatStopped) {
  Scheduler s(config(64, 4));
  s.add_request("a", std::vector<int32_t>{1, 2, 3}, params(10, {7}, {}));
  s.add_request("b", std::vector<int32_t>{4, 5, 6}, params(1, {7}, {}));
  const StepPlan& p1 = s.schedule();
  ASSERT_EQ(p1.num_seqs, 2);
  s.advance(p1);
  EXPECT_THROW(s.advance(p1), ValueError);
  const StepPlan& p2 = s.schedule();
  // b reached max_tokens whatever its token: not scheduled again. a decodes its placeholder.
  ASSERT_EQ(p2.num_seqs, 1);
  EXPECT_EQ(p2.input_ids[0], -1);           // plan 1's entry 0 holds the token
  EXPECT_THROW(s.advance(p2), ValueError);  // resolve() first
  std::vector<int64_t> tokens = {7, 12};
  const std::vector<Finished>& done = s.resolve(tokens.data(), tokens.size());
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].reason, FinishReason::kEos);
  EXPECT_EQ(done[1].reason, FinishReason::kLength);
  EXPECT_EQ(p2.slots[0], -1);  // a's entry in the step scheduled meanwhile is dropped
  s.advance(p2);
  std::vector<int64_t> none = {-1};
  EXPECT_TRUE(s.resolve(none.data(), none.size()).empty());
  EXPECT_FALSE(s.has_unfinished_requests());
  EXPECT_EQ(s.num_free_blocks(), 64);
}

TEST(SchedulerFinish, AbortWhileUnresolvedIsSkipped) {
  Scheduler s(config(64, 4));
  s.add_request("a", std::vector<int32_t>{1, 2, 3}, params(10, {7}, {}));
  s.advance(s.schedule());
  EXPECT_TRUE(s.abort_request("a"));
  s.add_request("b", std::vector<int32_t>{4, 5}, params(10, {7}, {}));  // may reuse a's slot
  std::vector<int64_t> none = {-1};
  EXPECT_TRUE(s.resolve(none.data(), none.size()).empty());
  EXPECT_EQ(s.get_num_generated("b"), 0);
  EXPECT_TRUE(s.abort_request("b"));
  EXPECT_EQ(s.num_free_blocks(), 64);
}

// Random traces (preemption in both modes, prefix caching, chunking): the overlapped protocol
// ends every request with the tokens the serial one gives, and frees every block.
TEST(SchedulerFinish, OverlapEndsLikeSerial) {
  for (PreemptionMode mode : {PreemptionMode::kRecompute, PreemptionMode::kSwap}) {
    for (uint32_t seed = 0; seed < 4; ++seed) {
      std::map<std::string, std::vector<int32_t>> results[2];
      int64_t preemptions = 0;
      for (bool overlap : {false, true}) {
        SchedulerConfig c = config(40, 4, 64, 8);
        c.preemption_mode = mode;
        c.num_cpu_blocks = mode == PreemptionMode::kSwap ? 40 : 0;
        c.enable_prefix_caching = seed % 2 == 0;
        c.enable_chunked_prefill = seed % 3 != 2;
        c.max_model_len = 64;
        Scheduler s(c);
        Driver d(s, seed);
        d.overlap = overlap;
        d.eos_rate = 0.05;
        std::mt19937 rng(seed);
        std::vector<int32_t> shared = random_tokens(rng, 16);
        for (int i = 0; i < 60; ++i) {
          int32_t len = 1 + static_cast<int32_t>(rng() % 40);
          std::vector<int32_t> prompt = random_tokens(rng, len);
          if (rng() % 2) std::copy_n(shared.begin(), std::min(len, 16), prompt.begin());
          RequestParams p = params(1 + static_cast<int32_t>(rng() % 20), {d.eos, 3}, {4},
                                   static_cast<int32_t>(rng() % 2));
          d.add("r" + std::to_string(i), prompt, p);
        }
        d.run_to_end();
        if (HasFatalFailure() || HasFailure()) return;
        EXPECT_EQ(s.num_free_blocks(), c.num_blocks) << "leaked blocks";
        EXPECT_EQ(s.allocator().num_free_cpu_blocks(), c.num_cpu_blocks);
        results[overlap] = d.finished();
        preemptions += s.counters().num_preemptions;
      }
      EXPECT_EQ(results[0].size(), 60u);
      EXPECT_EQ(results[0], results[1]) << "seed " << seed;
      if (seed == 0) EXPECT_GT(preemptions, 0) << "trace too easy";
    }
  }
}

}  // namespace
}  // namespace pagedkv
