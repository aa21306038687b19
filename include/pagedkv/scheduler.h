// Scheduler: continuous batching over a paged KV cache (vLLM-v1-like policy).
//
// One loop under one token budget per step: running sequences first (decodes, then chunks of
// prefills already under way), then swapped-out and waiting ones in queue order, within
// max_num_batched_tokens and max_num_seqs. Prompts are chunked when enable_chunked_prefill.
// When blocks run out, the lowest-priority / latest-arrived running sequence not yet scheduled
// in this step is preempted (recompute: blocks freed, requeued at its place with its generated
// tokens; swap: blocks moved to the host pool). A step that preempted admits nothing new, and a
// preempted sequence is resumed only when its whole remaining prefill fits in free blocks, so
// it is not preempted again at once (no preemption storms). Under SchedulingPolicy::kPriority
// the queues are ordered by (priority, arrival), victims are taken from the lowest priority, and
// a waiting request that outranks a running one and does not fit preempts it at the start of
// the step.
//
// Usage: add_request(...); loop { plan = schedule(); run model; update(plan, sampled); }.
// Overlapped (the host plans step N+1 while the device runs step N): after launching plan N,
// advance(plan N) (each sampling entry gets a placeholder token), schedule() step N+1 (its
// input_ids hold placeholder -1 - i where entry i of plan N's token goes; the engine fills
// them in on the device), launch it, then resolve(step N's tokens) before advancing N+1. A
// sequence that step N finished by a token is still in plan N+1: resolve() drops its entry
// there (slots[i] = -1) and the engine discards that row.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pagedkv/finish_reason.h"
#include "pagedkv/scheduler_config.h"
#include "pagedkv/step_plan.h"

namespace pagedkv {

class BlockAllocator;

// Per-request stopping rules and scheduling attributes.
struct RequestParams {
  int32_t max_tokens = 16;              // tokens to generate at most (>= 1)
  std::vector<int32_t> eos_token_ids;   // finish when one is sampled (after min_tokens)
  std::vector<int32_t> stop_token_ids;  // the same, reported as the stop reason
  int32_t priority = 0;                 // lower = sooner, with SchedulingPolicy::kPriority
  bool ignore_eos = false;              // keep going past eos (stop_token_ids still apply)
  int32_t min_tokens = 0;               // eos / stop ids do not finish before this many tokens
  uint64_t cache_salt = 0;              // separates prefix-cache namespaces (0 = shared)
};

struct SchedulerCounters {
  int64_t num_preemptions = 0;            // recompute + swap
  int64_t prefix_cache_query_tokens = 0;  // prompt tokens looked up at admission
  int64_t prefix_cache_hit_tokens = 0;    // of which found in the cache
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  const SchedulerConfig& config() const;

  // Queues a request. Throws ValueError (naming the argument) for an empty prompt, a negative
  // token id, a duplicate id, max_tokens < 1, prompt + max_tokens > max_model_len, or a request
  // that could never fit in num_blocks. Returns the request's slot: a small integer naming it
  // in StepPlan::slots while it lives (see request_id()).
  int32_t add_request(const std::string& request_id, const int32_t* prompt, size_t prompt_len,
                      const RequestParams& params);
  int32_t add_request(const std::string& request_id, const std::vector<int32_t>& prompt,
                      const RequestParams& params) {
    return add_request(request_id, prompt.data(), prompt.size(), params);
  }
  // Removes a request wherever it is and frees its blocks. false for an unknown id.
  bool abort_request(const std::string& request_id);

  // Plans the next step. The plan (owned by the scheduler) stays valid until the next call.
  // Throws ValueError when the previous non-empty plan was not passed to update().
  const StepPlan& schedule();

  // Applies a step's results: `sampled[i]` is the token sampled for plan entry i (ignored where
  // plan.sample_indices[i] < 0; pass -1). Returns the requests that finished and why, in plan
  // order; their blocks are freed at once (their ids stay readable via request_id() until the
  // next schedule()). Same as advance(plan) then resolve(sampled, n), checked first. A plan
  // entry with draft tokens needs update_accepted().
  const std::vector<Finished>& update(const StepPlan& plan, const int64_t* sampled, size_t n);
  // Speculative decoding (and the general form of update()): entry i emitted counts[i] tokens,
  // stored one entry after the other in `tokens` (num_tokens in all). A sampling entry emits
  // 1 to plan.num_draft_tokens[i] + 1 tokens: its drafts up to the first rejected one, then
  // the target's own token; an entry that samples nothing (sample_indices < 0) emits 0. Tokens
  // are appended up to a finish (the same rule as update()); the rest are dropped (see
  // num_appended()). The KV slots of rejected drafts are given back: the request keeps only
  // the blocks its accepted tokens need, and only full accepted blocks enter the prefix cache.
  // Throws ValueError (nothing changed) when counts are out of range, the sum differs from
  // num_tokens, or an emitted token other than the last differs from its draft. Not for
  // overlapped steps (advance() refuses a plan with drafts).
  const std::vector<Finished>& update_accepted(const StepPlan& plan, const int64_t* tokens,
                                               size_t num_tokens, const int32_t* counts, size_t n);
  // Per entry of the plan passed to the last update_accepted(): how many tokens it appended.
  const std::vector<int32_t>& num_appended() const;

  // Speculative decoding: tokens proposed to follow the request's current tokens. The next
  // schedule() feeds up to all of them after the request's last token when it decodes (fewer
  // within the step's budget, max_tokens, or when its blocks would not fit: drafts never cause
  // a preemption), and consumes them. Throws ValueError for an unknown id or a negative token.
  void set_draft_tokens(const std::string& request_id, const int32_t* tokens, size_t n);

  // Convenience: the finished request ids.
  std::vector<std::string> update(const StepPlan& plan, const std::vector<int64_t>& sampled);

  // Overlap, first half: the plan's tokens are computed; each sampling entry i gets the
  // placeholder token -1 - i. A sequence that has then reached max_tokens is not scheduled
  // again. schedule() may run next; resolve() must come before the next advance() / update().
  void advance(const StepPlan& plan);
  // Overlap, second half: the tokens of the advanced step (one per entry of that plan, -1
  // where it did not sample or was aborted since). Finishes as update() does, and drops the
  // finished sequences' entries from a plan scheduled meanwhile (slots[i] = -1).
  const std::vector<Finished>& resolve(const int64_t* sampled, size_t n);
  // Whether an advanced step awaits resolve().
  bool has_unresolved_step() const;

  // What finishing `token` as the next generated token of a live request would cause (kNone:
  // it goes on). The engine asks this; the rule itself lives in the scheduler only.
  Finished would_finish(const std::string& request_id, int32_t token) const;

  // n > 1 sampling: right after the update() that completed the parent's prompt, creates
  // `child_id` = parent prompt + [first_token] sharing all the parent's prompt blocks (the
  // shared partial block is copied on write). Returns why the child finished at once (stop
  // token or max_tokens == 1; it is then freed immediately), else reason kNone. If the parent
  // itself finished in that update() (its first token was a stop token), or was preempted
  // since, the child still starts: it re-prefills its prompt (mostly from the prefix cache)
  // instead of sharing blocks.
  Finished fork(const std::string& parent_id, const std::string& child_id, int32_t first_token);

  const std::string& request_id(int32_t slot) const;
  int32_t slot_of(const std::string& request_id) const;  // -1 when unknown
  bool has_request(const std::string& request_id) const;
  std::vector<int32_t> get_token_ids(const std::string& request_id) const;
  int32_t get_num_generated(const std::string& request_id) const;

  bool has_unfinished_requests() const;
  int32_t num_running() const;
  int32_t num_waiting() const;
  int32_t num_swapped() const;
  int32_t num_free_blocks() const;
  double kv_cache_usage() const;  // fraction of device blocks in use, 0..1
  const SchedulerCounters& counters() const;
  const BlockAllocator& allocator() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagedkv
