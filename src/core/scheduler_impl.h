// Scheduler::Impl: the scheduler's state, shared by scheduler.cpp (requests, update) and
// scheduler_step.cpp (the per-step policy). Internal.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv_cache_manager.h"
#include "pagedkv/scheduler.h"
#include "request.h"
#include "step_plan_builder.h"

namespace pagedkv {

using RequestQueue = std::set<Request*, RequestKeyLess>;

struct Scheduler::Impl {
  explicit Impl(const SchedulerConfig& config);

  SchedulerConfig config;
  int32_t max_model_len;
  KvCacheManager kv;
  StepPlan plan;
  StepPlanBuilder builder;
  bool plan_pending = false;  // a non-empty plan awaits update() / advance()
  // The advanced step awaiting resolve(): its plan's slots (-1: aborted since) and which
  // entries sampled (so a plan scheduled meanwhile can reuse the plan buffer).
  bool unresolved = false;
  std::vector<int32_t> advanced_slots;
  std::vector<uint8_t> advanced_samples;
  SchedulerCounters counters;

  // Requests by slot; freed slots are reused (their Request objects too).
  std::vector<std::unique_ptr<Request>> pool;
  std::vector<int32_t> free_slots;
  std::vector<int32_t> finished_slots;  // finished in the last update(), recycled next step
  std::unordered_map<std::string, int32_t> by_id;
  int64_t next_arrival = 0;

  std::vector<Request*> running;  // sorted by RequestKeyLess: back = first preemption victim
  RequestQueue waiting;           // new and recompute-preempted requests
  RequestQueue swapped;           // swap-preempted requests

  // Per-step scratch.
  std::vector<ScheduledEntry> entries;
  std::vector<Request*> admitted;
  std::vector<Finished> finished;
  std::vector<int32_t> appended;  // per plan entry: tokens the last update_accepted() appended

  // scheduler.cpp
  Request* find(const std::string& id) const;
  Request* new_request(const std::string& id);
  // Frees the request's blocks and its id; its slot is reused at once or (for requests that
  // finished in update()) from the next schedule() on.
  void release(Request* req, bool recycle_slot = true);
  Request* just_finished(const std::string& id) const;
  // Takes the request out of whichever queue holds it (none once it awaits resolve()).
  void unlink(Request* req);
  // Replaces `slot` by -1 in the pending plan and the advanced step: its entries are skipped.
  void drop_entries(int32_t slot);
  void check_sampled(const int32_t* slots, const uint8_t* samples, size_t num_entries,
                     const int64_t* sampled, size_t n) const;
  void check_accepted(const int64_t* tokens, size_t num_tokens, const int32_t* counts,
                      size_t n) const;
  void apply_accepted(const int64_t* tokens, const int32_t* counts);
  void check_new_request(const std::string& id, size_t prompt_len,
                         const RequestParams& params) const;

  // scheduler_step.cpp
  void schedule_step();
  void schedule_running(int32_t* budget, bool* preempted);
  int32_t usable_drafts(const Request& req, int32_t budget_left) const;
  void schedule_queued(int32_t* budget);
  bool try_swap_in(Request* req, int32_t* budget);
  bool try_admit(Request* req, int32_t* budget);
  Request* pick_victim();
  void preempt_for_priority();
  void preempt(Request* victim);
  void insert_running(Request* req);
  void erase_running(Request* req);
};

}  // namespace pagedkv
