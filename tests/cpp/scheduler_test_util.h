// Helpers for the scheduler tests: a plan checker against the metadata contract, and a driver
// that plays the model (fake sampled tokens) and remembers what every request must contain.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
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
class Driver {
 public:
  explicit Driver(Scheduler& s, uint32_t seed = 0) : s_(s), rng_(seed) {}

  void add(const std::string& id, std::vector<int32_t> prompt, const RequestParams& p) {
    int32_t slot = s_.add_request(id, prompt, p);
    live_[id] = {slot, std::move(prompt), p};
  }
  void abort(const std::string& id) {
    ASSERT_TRUE(s_.abort_request(id));
    live_.erase(id);
  }
  // One step; returns the plan's copy of request ids in batch order.
  std::vector<std::string> step() {
    const StepPlan& p = s_.schedule();
    std::vector<std::string> ids;
    check_plan(s_, p, [&](int32_t slot) { return tokens_of(slot); });
    std::vector<int64_t> sampled(p.num_seqs, -1);
    for (int32_t i = 0; i < p.num_seqs; ++i) {
      ids.push_back(s_.request_id(p.slots[i]));
      if (p.sample_indices[i] >= 0) sampled[i] = next_token(ids.back());
    }
    for (int32_t i = 0; i < p.num_seqs; ++i) {
      if (sampled[i] >= 0) live_[ids[i]].tokens.push_back(static_cast<int32_t>(sampled[i]));
    }
    for (const std::string& id : s_.update(p, sampled)) {
      const Live& l = live_.at(id);
      const int32_t gen = static_cast<int32_t>(l.tokens.size() - l.prompt_len);
      const int32_t last = l.tokens.back();
      const bool stop = !l.params.ignore_eos && last == l.params.eos_token_id;
      EXPECT_TRUE(gen == l.params.max_tokens || (stop && gen >= l.params.min_tokens))
          << id << " finished after " << gen << " tokens";
      finished_[id] = l.tokens;
      live_.erase(id);
    }
    for (auto& [id, l] : live_) {
      EXPECT_EQ(s_.get_token_ids(id), l.tokens) << "tokens of " << id << " changed";
    }
    return ids;
  }
  void run_to_end(int max_steps = 100000) {
    for (int n = 0; s_.has_unfinished_requests() && n < max_steps; ++n) step();
    ASSERT_FALSE(s_.has_unfinished_requests()) << "no progress";
  }
  int32_t eos = 7;
  double eos_rate = 0.0;
  const std::map<std::string, std::vector<int32_t>>& finished() const { return finished_; }

 private:
  struct Live {
    int32_t slot;
    std::vector<int32_t> tokens;
    RequestParams params;
    size_t prompt_len = 0;
    Live() = default;
    Live(int32_t s, std::vector<int32_t> t, RequestParams p)
        : slot(s), tokens(std::move(t)), params(std::move(p)), prompt_len(tokens.size()) {}
  };
  std::vector<int32_t> tokens_of(int32_t slot) {
    for (auto& [id, l] : live_)
      if (l.slot == slot) return l.tokens;
    ADD_FAILURE() << "plan names an unknown slot " << slot;
    return {};
  }
  int64_t next_token(const std::string&) {
    if (eos_rate > 0 && std::uniform_real_distribution<>(0, 1)(rng_) < eos_rate) return eos;
    return std::uniform_int_distribution<int32_t>(10, 1000)(rng_);
  }
  Scheduler& s_;
  std::mt19937 rng_;
  std::map<std::string, Live> live_;
  std::map<std::string, std::vector<int32_t>> finished_;
};

inline std::vector<int32_t> random_tokens(std::mt19937& rng, int32_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = std::uniform_int_distribution<int32_t>(10, 1000)(rng);
  return t;
}

}  // namespace pagedkv::testing
