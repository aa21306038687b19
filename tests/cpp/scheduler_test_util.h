// Helpers for the scheduler tests: a plan checker against the metadata contract, and a driver
// that plays the model (fake sampled tokens) and remembers what every request must contain.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace pagedkv::testing {

// Checks every array of `p` against the contract, independently of how it was built.
// `expected_tokens(slot)` gives the tokens the request must hold (prompt + generated so far).
template <typename TokensOf>
void check_plan(const Scheduler& s, const StepPlan& p, TokensOf&& expected_tokens) {
  const SchedulerConfig& c = s.config();
  const int32_t bs = c.block_size;
  ASSERT_LE(p.num_tokens, c.max_num_batched_tokens);
  ASSERT_LE(p.num_seqs, c.max_num_seqs);
  ASSERT_EQ(p.query_start_loc[0], 0);
  ASSERT_EQ(p.seq_start_loc[0], 0);
  ASSERT_EQ(p.num_prefill_tokens + p.num_decode_tokens, p.num_tokens);
  int32_t max_q = 0, max_pre = 0, max_dec = 0;
  std::set<int64_t> written;
  std::set<int32_t> seen_slots;
  for (int32_t i = 0; i < p.num_seqs; ++i) {
    const int32_t q = p.query_start_loc[i + 1] - p.query_start_loc[i];
    ASSERT_GE(q, 1);
    ASSERT_EQ(p.seq_lens[i], p.context_lens[i] + q);
    ASSERT_EQ(p.seq_start_loc[i + 1] - p.seq_start_loc[i], p.seq_lens[i]);
    ASSERT_TRUE(seen_slots.insert(p.slots[i]).second) << "request twice in one plan";
    const std::vector<int32_t> toks = expected_tokens(p.slots[i]);
    ASSERT_LE(p.seq_lens[i], static_cast<int32_t>(toks.size()));
    const bool samples = p.seq_lens[i] == static_cast<int32_t>(toks.size());
    ASSERT_EQ(p.sample_indices[i], samples ? p.query_start_loc[i + 1] - 1 : -1);
    if (i >= p.num_prefills) ASSERT_EQ(q, 1) << "decode entries feed one token";
    const int32_t* row = p.block_table_row(i);
    for (int32_t t = p.query_start_loc[i]; t < p.query_start_loc[i + 1]; ++t) {
      const int64_t pos = p.context_lens[i] + (t - p.query_start_loc[i]);
      ASSERT_EQ(p.positions[t], pos);
      ASSERT_EQ(p.input_ids[t], toks[pos]);
      ASSERT_EQ(p.slot_mapping[t], int64_t{row[pos / bs]} * bs + pos % bs);
      ASSERT_TRUE(written.insert(p.slot_mapping[t]).second) << "two tokens write one slot";
      ASSERT_GE(row[pos / bs], 0);
      ASSERT_LT(row[pos / bs], c.num_blocks);
    }
    max_q = std::max(max_q, q);
    (i < p.num_prefills ? max_pre : max_dec) =
        std::max(i < p.num_prefills ? max_pre : max_dec, p.seq_lens[i]);
  }
  ASSERT_EQ(p.query_start_loc[p.num_seqs], p.num_tokens);
  ASSERT_EQ(p.query_start_loc[p.num_prefills], p.num_prefill_tokens);
  ASSERT_EQ(p.max_query_len, max_q);
  ASSERT_EQ(p.max_prefill_seq_len, max_pre);
  ASSERT_EQ(p.max_decode_seq_len, max_dec);
}

// Plays the model: feeds deterministic fake tokens and checks each plan. Tracks, per live
// request, the tokens it must hold, so that no token can be lost or altered by preemption.
// A token depends only on the request and its length (as a greedy model's would), so serial
// and overlapped runs of the same requests must end with the same tokens.
class Driver {
 public:
  explicit Driver(Scheduler& s, uint32_t seed = 0) : s_(s), seed_(seed) {}

  void add(const std::string& id, std::vector<int32_t> prompt, const RequestParams& p) {
    int32_t slot = s_.add_request(id, prompt, p);
    live_[id] = {slot, std::move(prompt), p};
  }
  void abort(const std::string& id) {
    ASSERT_TRUE(s_.abort_request(id));
    live_.erase(id);
  }
  // One step; returns the plan's copy of request ids in batch order. Overlapped: the step
  // advanced last time is resolved only after this one is scheduled.
  std::vector<std::string> step() {
    const StepPlan& p = s_.schedule();
    std::vector<std::string> ids;
    check_plan(s_, p, [&](int32_t slot) { return tokens_of(slot); });
    for (int32_t i = 0; i < p.num_seqs; ++i) ids.push_back(s_.request_id(p.slots[i]));
    if (overlap) {
      if (s_.has_unresolved_step()) {
        finish(s_.resolve(pending_.data(), pending_.size()));
        for (auto& [id, l] : live_) l.placeholder = 0;  // the scheduler has the tokens now
      }
      if (p.num_seqs == 0) return ids;
      pending_ = sample(p);
      s_.advance(p);
      for (int32_t i = 0; i < p.num_seqs; ++i) {
        if (pending_[i] >= 0) live_.at(ids[i]).placeholder = -1 - i;
      }
    } else {
      std::vector<int64_t> sampled = sample(p);
      finish(s_.update(p, sampled.data(), sampled.size()));
    }
    for (auto& [id, l] : live_) {
      EXPECT_EQ(s_.get_token_ids(id), tokens_of(l.slot)) << "tokens of " << id << " changed";
    }
    return ids;
  }
  void run_to_end(int max_steps = 100000) {
    for (int n = 0; (s_.has_unfinished_requests() || s_.has_unresolved_step()) && n < max_steps;
         ++n) {
      step();
    }
    ASSERT_FALSE(s_.has_unfinished_requests()) << "no progress";
  }
  bool overlap = false;
  int32_t eos = 7;
  double eos_rate = 0.0;
  const std::map<std::string, std::vector<int32_t>>& finished() const { return finished_; }

 private:
  struct Live {
    int32_t slot;
    std::vector<int32_t> tokens;
    RequestParams params;
    size_t prompt_len = 0;
    int32_t placeholder = 0;  // < 0: the scheduler holds this for the last token (overlap)
    Live() = default;
    Live(int32_t s, std::vector<int32_t> t, RequestParams p)
        : slot(s), tokens(std::move(t)), params(std::move(p)), prompt_len(tokens.size()) {}
  };
  // The plan's tokens: one per entry that samples (slot -1: dropped since, -1 too).
  std::vector<int64_t> sample(const StepPlan& p) {
    std::vector<int64_t> sampled(static_cast<size_t>(p.num_seqs), -1);
    for (int32_t i = 0; i < p.num_seqs; ++i) {
      if (p.slots[i] < 0 || p.sample_indices[i] < 0) continue;
      Live& l = live_.at(s_.request_id(p.slots[i]));
      sampled[i] = next_token(s_.request_id(p.slots[i]), l.tokens.size());
      l.tokens.push_back(static_cast<int32_t>(sampled[i]));
    }
    return sampled;
  }
  void finish(const std::vector<Finished>& done) {
    for (const Finished& f : done) {
      const std::string& id = s_.request_id(f.slot);
      const Live& l = live_.at(id);
      const int32_t gen = static_cast<int32_t>(l.tokens.size() - l.prompt_len);
      const int32_t last = l.tokens.back();
      const auto& eos_ids = l.params.eos_token_ids;
      const auto& stops = l.params.stop_token_ids;
      const bool is_eos = std::find(eos_ids.begin(), eos_ids.end(), last) != eos_ids.end();
      const bool is_stop = std::find(stops.begin(), stops.end(), last) != stops.end();
      switch (f.reason) {
        case FinishReason::kLength: EXPECT_EQ(gen, l.params.max_tokens) << id; break;
        case FinishReason::kEos:
          EXPECT_TRUE(is_eos && !l.params.ignore_eos && gen >= l.params.min_tokens) << id;
          break;
        case FinishReason::kStopToken:
          EXPECT_TRUE(is_stop && f.stop_token_id == last && gen >= l.params.min_tokens) << id;
          break;
        case FinishReason::kNone: ADD_FAILURE() << id << " finished without a reason"; break;
      }
      finished_[id] = l.tokens;
      live_.erase(id);
    }
  }
  std::vector<int32_t> tokens_of(int32_t slot) {
    for (auto& [id, l] : live_) {
      if (l.slot != slot) continue;
      std::vector<int32_t> t = l.tokens;
      if (l.placeholder < 0) t.back() = l.placeholder;
      return t;
    }
    ADD_FAILURE() << "plan names an unknown slot " << slot;
    return {};
  }
  int64_t next_token(const std::string& id, size_t len) {
    std::seed_seq seq{seed_, static_cast<uint32_t>(std::hash<std::string>()(id)),
                      static_cast<uint32_t>(len)};
    std::mt19937 rng(seq);
    if (eos_rate > 0 && std::uniform_real_distribution<>(0, 1)(rng) < eos_rate) return eos;
    return std::uniform_int_distribution<int32_t>(10, 1000)(rng);
  }
  Scheduler& s_;
  uint32_t seed_;
  std::vector<int64_t> pending_;  // the advanced step's tokens (overlap)
  std::map<std::string, Live> live_;
  std::map<std::string, std::vector<int32_t>> finished_;
};

inline std::vector<int32_t> random_tokens(std::mt19937& rng, int32_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = std::uniform_int_distribution<int32_t>(10, 1000)(rng);
  return t;
}

}  // namespace pagedkv::testing
