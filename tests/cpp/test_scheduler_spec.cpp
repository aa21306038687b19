// Scheduler under speculative decoding: k draft tokens scheduled as a k+1-token query, the
// accepted tokens applied by update_accepted(), the rejected drafts' slots and blocks rolled
// back, prefix-cache hashes only for full accepted blocks, preemption of a speculating
// sequence, and a random trace whose output equals plain decoding with nothing leaked.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "pagedkv/pagedkv.h"
#include "scheduler_test_util.h"

namespace pagedkv {
namespace {

SchedulerConfig config(int32_t num_blocks, int32_t block_size, int32_t budget = 256,
                       bool prefix_caching = true) {
  SchedulerConfig c;
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = 16;
  c.enable_prefix_caching = prefix_caching;
  return c;
}

RequestParams max_tokens(int32_t n) {
  RequestParams p;
  p.max_tokens = n;
  return p;
}

std::vector<int32_t> range_tokens(int32_t first, int32_t n) {
  std::vector<int32_t> t;
  for (int32_t i = 0; i < n; ++i) t.push_back(first + i);
  return t;
}

// Prefills the requests `ids` (prompts of prompt_len tokens) in one step and samples each one's
// first token, 500.
void prefill(Scheduler& s, const std::vector<std::string>& ids, int32_t prompt_len,
             int32_t max_new) {
  for (const std::string& id : ids)
    s.add_request(id, range_tokens(100, prompt_len), max_tokens(max_new));
  const StepPlan& p = s.schedule();
  ASSERT_EQ(p.num_seqs, static_cast<int32_t>(ids.size()));
  s.update(p, std::vector<int64_t>(ids.size(), 500));
}

const std::vector<Finished>& update_one(Scheduler& s, const StepPlan& p,
                                        const std::vector<int64_t>& emitted) {
  const int32_t count = static_cast<int32_t>(emitted.size());
  return s.update_accepted(p, emitted.data(), emitted.size(), &count, 1);
}

// One request with 6 prompt tokens + 1 sampled (7 tokens, 6 cached), block size 4, 4 drafts.
class SpecStep : public ::testing::Test {
 protected:
  SpecStep() : s(config(32, 4)) {
    prefill(s, {"a"}, 6, 20);
    s.set_draft_tokens("a", draft.data(), draft.size());
  }
  Scheduler s;
  std::vector<int32_t> draft{601, 602, 603, 604};
};

TEST_F(SpecStep, DraftsAreAnExtendQueryWithSlotsForAllOfThem) {
  const int32_t free_before = s.num_free_blocks();  // 2 blocks held for 6 cached tokens
  const StepPlan& p = s.schedule();
  ASSERT_EQ(p.num_seqs, 1);
  EXPECT_EQ(p.num_prefills, 1) << "a multi-token query runs on the extend path";
  EXPECT_EQ(p.num_prefill_tokens, 5);
  EXPECT_EQ(p.num_decode_tokens, 0);
  EXPECT_EQ(p.num_draft_tokens[0], 4);
  EXPECT_EQ(p.num_draft_tokens_total, 4);
  EXPECT_EQ(p.context_lens[0], 6);
  EXPECT_EQ(p.seq_lens[0], 11);
  EXPECT_EQ(p.max_query_len, 5);
  EXPECT_EQ(p.sample_indices[0], 4);
  EXPECT_EQ(std::vector<int32_t>(p.input_ids.begin(), p.input_ids.begin() + 5),
            (std::vector<int32_t>{500, 601, 602, 603, 604}));
  const int32_t* row = p.block_table_row(0);
  for (int32_t t = 0; t < 5; ++t) {
    const int32_t pos = 6 + t;
    EXPECT_EQ(p.positions[t], pos);
    EXPECT_EQ(p.slot_mapping[t], int64_t{row[pos / 4]} * 4 + pos % 4);
  }
  EXPECT_EQ(s.num_free_blocks(), free_before - 1) << "11 tokens need 3 blocks";
  EXPECT_THROW(s.update(p, {700}), ValueError) << "a draft plan needs update_accepted";
}

TEST_F(SpecStep, AFailedStepAbortsItsSpeculatingEntriesAndPassesNoTokens) {
  const StepPlan& p = s.schedule();
  ASSERT_TRUE(s.abort_request("a"));
  EXPECT_TRUE(s.update(p, {-1}).empty());
  EXPECT_EQ(s.num_free_blocks(), 32);
}

TEST_F(SpecStep, AcceptAllKeepsEveryBlockAndAppendsKPlusOne) {
  const StepPlan& p = s.schedule();
  const int32_t free_after_schedule = s.num_free_blocks();
  EXPECT_TRUE(update_one(s, p, {601, 602, 603, 604, 605}).empty());
  EXPECT_EQ(s.num_appended(), std::vector<int32_t>{5});
  std::vector<int32_t> want = range_tokens(100, 6);
  for (int32_t t : {500, 601, 602, 603, 604, 605}) want.push_back(t);
  EXPECT_EQ(s.get_token_ids("a"), want);
  EXPECT_EQ(s.num_free_blocks(), free_after_schedule);
  // The next step decodes 605 at position 11, after 11 cached tokens.
  const StepPlan& q = s.schedule();
  EXPECT_EQ(q.num_decode_tokens, 1);
  EXPECT_EQ(q.context_lens[0], 11);
  EXPECT_EQ(q.input_ids[0], 605);
  // Full accepted blocks [0, 8) are cached: 2 blocks.
  EXPECT_EQ(s.allocator().num_cached_blocks(), 2);
}

TEST_F(SpecStep, RejectAllRollsBackTheNewBlock) {
  const int32_t free_before = s.num_free_blocks();
  const StepPlan& p = s.schedule();
  EXPECT_TRUE(update_one(s, p, {777}).empty());
  EXPECT_EQ(s.num_free_blocks(), free_before) << "the block of rejected drafts is freed";
  EXPECT_EQ(s.get_num_generated("a"), 2);
  const StepPlan& q = s.schedule();
  EXPECT_EQ(q.num_decode_tokens, 1);
  EXPECT_EQ(q.context_lens[0], 7);
  EXPECT_EQ(q.input_ids[0], 777);
  EXPECT_EQ(q.num_draft_tokens_total, 0) << "drafts are consumed by one schedule()";
  EXPECT_EQ(s.allocator().num_cached_blocks(), 1) << "only [0, 4) is full and accepted";
  EXPECT_EQ(s.allocator().check_invariants(), "");
}

TEST_F(SpecStep, PartialAcceptKeepsTheBlocksOfAcceptedTokens) {
  const StepPlan& p = s.schedule();
  const int32_t free_after_schedule = s.num_free_blocks();
  update_one(s, p, {601, 602, 777});  // 2 drafts accepted, then the target's own token
  // Cached now: 6 + [500, 601, 602] = 9 tokens, 3 blocks: nothing to give back.
  EXPECT_EQ(s.num_free_blocks(), free_after_schedule);
  const StepPlan& q = s.schedule();
  EXPECT_EQ(q.context_lens[0], 9);
  EXPECT_EQ(q.input_ids[0], 777);
  EXPECT_EQ(q.slot_mapping[0], int64_t{q.block_table_row(0)[2]} * 4 + 1);
}

TEST_F(SpecStep, AcceptedUpToABlockBoundaryFreesTheNextBlock) {
  // 5 drafts: 12 tokens, 3 blocks; accept 1 draft -> 8 cached, exactly 2 full blocks.
  std::vector<int32_t> five{601, 602, 603, 604, 605};
  s.set_draft_tokens("a", five.data(), five.size());
  const int32_t free_before = s.num_free_blocks();
  const StepPlan& p = s.schedule();
  EXPECT_EQ(p.seq_lens[0], 12);
  EXPECT_EQ(s.num_free_blocks(), free_before - 1);
  update_one(s, p, {601, 888});
  EXPECT_EQ(s.num_free_blocks(), free_before) << "the third block held only rejected drafts";
  EXPECT_EQ(s.allocator().num_cached_blocks(), 2);
  const StepPlan& q = s.schedule();  // 888 goes to position 8: a fresh block
  EXPECT_EQ(q.context_lens[0], 8);
  EXPECT_EQ(s.num_free_blocks(), free_before - 1);
  EXPECT_EQ(q.slot_mapping[0], int64_t{q.block_table_row(0)[2]} * 4);
}

TEST_F(SpecStep, BadAcceptedTokensChangeNothing) {
  const StepPlan& p = s.schedule();
  EXPECT_THROW(update_one(s, p, {601, 999, 700}), ValueError) << "a token after a rejection";
  EXPECT_THROW(update_one(s, p, {601, 602, 603, 604, 605, 606}), ValueError) << "k + 2 tokens";
  EXPECT_THROW(update_one(s, p, {}), ValueError) << "a sampling entry emits >= 1 token";
  EXPECT_THROW(update_one(s, p, {-3}), ValueError);
  const int32_t count = 2;
  const int64_t one = 601;
  EXPECT_THROW(s.update_accepted(p, &one, 1, &count, 1), ValueError) << "counts add up to 2";
  EXPECT_EQ(s.get_num_generated("a"), 1);
  update_one(s, p, {601, 602, 603, 604, 605});
  EXPECT_EQ(s.get_num_generated("a"), 6);
  EXPECT_THROW(s.set_draft_tokens("nope", draft.data(), draft.size()), ValueError);
  const int32_t negative = -1;
  EXPECT_THROW(s.set_draft_tokens("a", &negative, 1), ValueError);
}

TEST_F(SpecStep, MaxTokensCapsTheDraftsAndFinishesTheRequest) {
  // max_tokens caps the drafts: a request with 2 tokens left feeds at most 1 draft.
  Scheduler t(config(32, 4));
  prefill(t, {"b"}, 6, 3);
  t.set_draft_tokens("b", draft.data(), draft.size());
  const StepPlan& tp = t.schedule();
  EXPECT_EQ(tp.num_draft_tokens[0], 1);
  EXPECT_EQ(update_one(t, tp, {601, 650}).size(), 1u) << "3 tokens: finished";
  EXPECT_EQ(t.num_appended(), std::vector<int32_t>{2});
  EXPECT_EQ(t.num_free_blocks(), 32);
  EXPECT_EQ(t.allocator().check_invariants(), "");
}

TEST(SchedulerSpec, EosAmongAcceptedDraftsFinishesThere) {
  Scheduler s(config(32, 4));
  RequestParams params = max_tokens(20);
  params.eos_token_ids = {7};
  s.add_request("a", range_tokens(100, 6), params);
  s.update(s.schedule(), {500});
  std::vector<int32_t> draft{601, 7, 603};
  s.set_draft_tokens("a", draft.data(), draft.size());
  const StepPlan& p = s.schedule();
  EXPECT_EQ(update_one(s, p, {601, 7, 603, 604}).size(), 1u);
  EXPECT_EQ(s.num_appended(), std::vector<int32_t>{2}) << "601 then eos: the rest is dropped";
  EXPECT_EQ(s.num_free_blocks(), 32);
}

TEST(SchedulerSpec, DraftsAreDroppedBeforeAnyoneIsPreempted) {
  // 5 blocks of 4: "a" and "b" hold 2 each after their 7-token prompts, 1 is free.
  Scheduler s(config(5, 4, 256, false));
  prefill(s, {"a", "b"}, 7, 10);
  ASSERT_EQ(s.num_free_blocks(), 1);
  std::vector<int32_t> draft{601, 602, 603, 604, 605, 606};
  s.set_draft_tokens("a", draft.data(), draft.size());  // would need 14 slots: 2 more blocks
  const StepPlan& p = s.schedule();
  EXPECT_EQ(p.num_draft_tokens_total, 0);
  EXPECT_EQ(p.num_seqs, 2);
  EXPECT_EQ(p.num_decode_tokens, 2);
  EXPECT_EQ(s.counters().num_preemptions, 0);
  s.update(p, {501, 502});
}

TEST(SchedulerSpec, APreemptedSpeculatingSequenceLosesItsDraftsNotItsTokens) {
  for (PreemptionMode mode : {PreemptionMode::kRecompute, PreemptionMode::kSwap}) {
    SchedulerConfig c = config(6, 4, 256, false);
    c.preemption_mode = mode;
    c.num_cpu_blocks = mode == PreemptionMode::kSwap ? 8 : 0;
    Scheduler s(c);
    prefill(s, {"a", "b"}, 8, 12);  // 9 tokens each, 8 cached: 2 blocks each, 2 free
    std::vector<int32_t> draft{601, 602, 603};
    s.set_draft_tokens("b", draft.data(), draft.size());
    // "a" speculates first and takes the last free blocks (8 + 8 tokens = 4 blocks): "b",
    // speculating too, must yield.
    std::vector<int32_t> long_draft(7, 650);
    s.set_draft_tokens("a", long_draft.data(), long_draft.size());
    const StepPlan& p = s.schedule();
    ASSERT_EQ(p.num_seqs, 1);
    EXPECT_EQ(s.request_id(p.slots[0]), "a");
    EXPECT_EQ(p.num_draft_tokens[0], 7);
    EXPECT_EQ(s.counters().num_preemptions, 1);
    const std::vector<int32_t> b_tokens = s.get_token_ids("b");
    update_one(s, p, {650, 651});
    EXPECT_EQ(s.num_free_blocks(), 3) << "a keeps 3 blocks for 10 cached tokens";
    bool b_resumed = false;
    for (int step = 0; step < 40 && s.has_unfinished_requests(); ++step) {
      const StepPlan& q = s.schedule();
      std::vector<int64_t> sampled(q.num_seqs, -1);
      for (int32_t i = 0; i < q.num_seqs; ++i) {
        EXPECT_EQ(q.num_draft_tokens[i], 0) << "b's drafts died with its preemption";
        if (q.sample_indices[i] >= 0) sampled[i] = 700 + step;
        if (s.request_id(q.slots[i]) == "b" && !b_resumed) {
          b_resumed = true;
          EXPECT_EQ(q.seq_lens[i], 9) << "all its tokens, none of its drafts";
          const int32_t query = q.query_start_loc[i + 1] - q.query_start_loc[i];
          EXPECT_EQ(query, mode == PreemptionMode::kSwap ? 1 : 9);
          if (mode == PreemptionMode::kRecompute) {
            EXPECT_EQ(std::vector<int32_t>(q.input_ids.begin() + q.query_start_loc[i],
                                           q.input_ids.begin() + q.query_start_loc[i + 1]),
                      b_tokens);
          }
        }
      }
      s.update(q, sampled);
    }
    EXPECT_TRUE(b_resumed);
    EXPECT_FALSE(s.has_unfinished_requests());
    EXPECT_EQ(s.num_free_blocks(), 6);
    EXPECT_EQ(s.allocator().check_invariants(), "");
  }
}

// A deterministic "model": the token after position `pos` of request `id`. Greedy speculative
// decoding against it must produce exactly what plain decoding does.
int32_t model_token(const std::string& id, size_t pos) {
  uint32_t h = static_cast<uint32_t>(std::hash<std::string>()(id)) * 2654435761u;
  h ^= static_cast<uint32_t>(pos) * 40503u;
  h ^= h >> 13;
  return static_cast<int32_t>(10 + (h % 40));  // a small vocabulary, so eos (7) never appears
}

std::map<std::string, std::vector<int32_t>> run_trace(uint32_t seed, bool speculate) {
  SchedulerConfig c = config(40, 4, 48, true);
  Scheduler s(c);
  std::mt19937 rng(seed);
  std::map<std::string, std::vector<int32_t>> out;
  for (int r = 0; r < 8; ++r) {
    const std::string id = "r" + std::to_string(r);
    const int32_t len = std::uniform_int_distribution<int32_t>(3, 20)(rng);
    out[id] = testing::random_tokens(rng, len);
    s.add_request(id, out[id], max_tokens(5 + 3 * r));
  }
  for (int step = 0; step < 2000 && s.has_unfinished_requests(); ++step) {
    const StepPlan& p = s.schedule();
    std::vector<int64_t> emitted;
    std::vector<int32_t> counts(static_cast<size_t>(p.num_seqs), 0);
    std::vector<std::string> ids;
    for (int32_t i = 0; i < p.num_seqs; ++i) {
      const std::string id = s.request_id(p.slots[i]);
      ids.push_back(id);
      if (p.sample_indices[i] < 0) continue;
      // Greedy verification: the model's token after each fed position, until a draft differs.
      const int32_t k = p.num_draft_tokens[i];
      const int32_t first = p.query_start_loc[i + 1] - k - 1;
      for (int32_t j = 0; j <= k; ++j) {
        const int32_t t = model_token(id, static_cast<size_t>(p.positions[first + j]));
        emitted.push_back(t);
        ++counts[i];
        if (j == k || p.input_ids[first + j + 1] != t) break;
      }
    }
    s.update_accepted(p, emitted.data(), emitted.size(), counts.data(), counts.size());
    size_t off = 0;
    for (int32_t i = 0; i < p.num_seqs; ++i) {
      std::vector<int32_t>& toks = out[ids[i]];
      toks.insert(toks.end(), emitted.begin() + off, emitted.begin() + off + s.num_appended()[i]);
      off += static_cast<size_t>(counts[i]);
      if (!s.has_request(ids[i])) continue;
      EXPECT_EQ(s.get_token_ids(ids[i]), toks);
      if (!speculate) continue;
      // Drafts: half of the time the model's true continuation (with a wrong tail), else noise.
      std::vector<int32_t> draft;
      const int32_t k = std::uniform_int_distribution<int32_t>(0, 5)(rng);
      const bool good = std::uniform_int_distribution<int32_t>(0, 1)(rng) == 1;
      for (int32_t j = 0; j < k; ++j) {
        const bool right = good && j < k - 1;
        draft.push_back(right ? model_token(ids[i], toks.size() - 1 + j) : 3);
      }
      s.set_draft_tokens(ids[i], draft.data(), draft.size());
    }
    EXPECT_EQ(s.allocator().check_invariants(), "") << "step " << step;
  }
  EXPECT_FALSE(s.has_unfinished_requests());
  EXPECT_EQ(s.num_free_blocks(), c.num_blocks) << "a block leaked";
  return out;
}

TEST(SchedulerSpec, RandomTraceEqualsPlainDecodingAndLeaksNothing) {
  for (uint32_t seed = 0; seed < 4; ++seed) {
    EXPECT_EQ(run_trace(seed, true), run_trace(seed, false)) << "seed " << seed;
  }
}

}  // namespace
}  // namespace pagedkv
