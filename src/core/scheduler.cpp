// Scheduler: requests, update() and queries. The per-step policy is in scheduler_step.cpp.
#include "pagedkv/scheduler.h"

#include <algorithm>
#include <limits>

#include "finish_rule.h"
#include "pagedkv/error.h"
#include "scheduler_impl.h"

namespace pagedkv {

static SchedulerConfig validated(const SchedulerConfig& c) {
  c.validate();
  return c;
}

Scheduler::Impl::Impl(const SchedulerConfig& c)
    : config(validated(c)), max_model_len(c.effective_max_model_len()), kv(c), builder(c, &plan) {
  running.reserve(static_cast<size_t>(c.max_num_seqs));
  entries.reserve(static_cast<size_t>(c.max_num_seqs));
  admitted.reserve(static_cast<size_t>(c.max_num_seqs));
}

Request* Scheduler::Impl::find(const std::string& id) const {
  auto it = by_id.find(id);
  return it == by_id.end() ? nullptr : pool[static_cast<size_t>(it->second)].get();
}

Request* Scheduler::Impl::new_request(const std::string& id) {
  int32_t slot;
  if (free_slots.empty()) {
    slot = static_cast<int32_t>(pool.size());
    pool.push_back(std::make_unique<Request>());
  } else {
    slot = free_slots.back();
    free_slots.pop_back();
  }
  Request* r = pool[static_cast<size_t>(slot)].get();
  r->id = id;
  r->slot = slot;
  r->arrival = next_arrival++;
  r->tokens.clear();
  r->blocks.clear();
  r->block_hashes.clear();
  r->cpu_blocks.clear();
  r->num_computed = 0;
  r->num_preemptions = 0;
  r->num_scheduled = 0;
  r->touch_blocks();
  by_id.emplace(id, slot);
  return r;
}

void Scheduler::Impl::release(Request* req, bool recycle_slot) {
  kv.free_blocks(*req);
  kv.free_cpu_blocks(*req);
  by_id.erase(req->id);
  req->state = RequestState::kFree;
  (recycle_slot ? free_slots : finished_slots).push_back(req->slot);
}

Request* Scheduler::Impl::just_finished(const std::string& id) const {
  for (int32_t slot : finished_slots) {
    Request* r = pool[static_cast<size_t>(slot)].get();
    if (r->id == id) return r;
  }
  return nullptr;
}

void Scheduler::Impl::unlink(Request* req) {
  switch (req->state) {
    case RequestState::kRunning: erase_running(req); break;
    case RequestState::kWaiting: waiting.erase(req); break;
    case RequestState::kSwapped: swapped.erase(req); break;
    case RequestState::kFinishing:
    case RequestState::kFree: break;
  }
}

void Scheduler::Impl::drop_entries(int32_t slot) {
  if (plan_pending) std::replace(plan.slots.begin(), plan.slots.begin() + plan.num_seqs, slot, -1);
  if (unresolved) std::replace(advanced_slots.begin(), advanced_slots.end(), slot, -1);
}

void Scheduler::Impl::check_sampled(const int32_t* slots, const uint8_t* samples,
                                    size_t num_entries, const int64_t* sampled, size_t n) const {
  PAGEDKV_CHECK(n == num_entries, "sampled_token_ids: expected ", num_entries,
                " entries (one per plan entry), got ", n);
  PAGEDKV_CHECK(sampled != nullptr || n == 0, "sampled_token_ids: null pointer for ", n,
                " entries");
  for (size_t i = 0; i < n; ++i) {
    if (slots[i] < 0 || !samples[i]) continue;
    PAGEDKV_CHECK(sampled[i] >= 0 && sampled[i] <= std::numeric_limits<int32_t>::max(),
                  "sampled_token_ids: entry ", i, " samples a token but got ", sampled[i]);
  }
}

void Scheduler::Impl::check_new_request(const std::string& id, size_t prompt_len,
                                        const RequestParams& p) const {
  PAGEDKV_CHECK(by_id.find(id) == by_id.end(), "request_id: '", id, "' is already in use");
  PAGEDKV_CHECK(prompt_len > 0, "prompt_token_ids: the prompt of '", id, "' is empty");
  PAGEDKV_CHECK(p.max_tokens >= 1, "max_tokens must be >= 1, got ", p.max_tokens);
  PAGEDKV_CHECK(p.min_tokens >= 0 && p.min_tokens <= p.max_tokens,
                "min_tokens must be in [0, max_tokens], got ", p.min_tokens);
  const int64_t total = static_cast<int64_t>(prompt_len) + p.max_tokens;
  PAGEDKV_CHECK(total <= max_model_len, "max_tokens: prompt (", prompt_len, ") + max_tokens (",
                p.max_tokens, ") = ", total, " exceeds max_model_len (", max_model_len, ")");
  const int64_t blocks = (total - 1 + config.block_size - 1) / config.block_size;
  PAGEDKV_CHECK(blocks <= config.num_blocks, "prompt_token_ids: request '", id, "' needs ", blocks,
                " blocks at its longest (prompt ", prompt_len, " + max_tokens ", p.max_tokens,
                ") but the cache has only num_blocks = ", config.num_blocks,
                "; it could never run");
}

// All checks before any change, so a bad call leaves the scheduler as it was.
void Scheduler::Impl::check_accepted(const int64_t* tokens, size_t num_tokens,
                                     const int32_t* counts, size_t n) const {
  const StepPlan& p = plan;
  PAGEDKV_CHECK(n == static_cast<size_t>(p.num_seqs), "num_accepted: expected ", p.num_seqs,
                " entries (one per plan entry), got ", n);
  PAGEDKV_CHECK(counts != nullptr, "num_accepted: null pointer for ", n, " entries");
  PAGEDKV_CHECK(tokens != nullptr || num_tokens == 0, "token_ids: null pointer for ", num_tokens,
                " tokens");
  size_t off = 0;
  for (int32_t i = 0; i < p.num_seqs; ++i) {
    const int32_t c = counts[i];
    const int32_t k = p.num_draft_tokens[i];
    const bool samples = p.sample_indices[i] >= 0;
    PAGEDKV_CHECK(c >= 0, "num_accepted: entry ", i, " is negative (", c, ")");
    PAGEDKV_CHECK(off + static_cast<size_t>(c) <= num_tokens, "token_ids: ", num_tokens,
                  " tokens, fewer than num_accepted adds up to");
    if (p.slots[i] >= 0) {  // an entry aborted since schedule() is skipped
      PAGEDKV_CHECK(samples ? c >= 1 && c <= k + 1 : c == 0, "num_accepted: entry ", i,
                    samples ? " must emit 1 to num_draft_tokens + 1 = " : " samples nothing: 0, ",
                    samples ? k + 1 : 0, " tokens, got ", c);
      // The KV computed this step holds the drafts: only a prefix of them can be kept.
      const int32_t* draft = &p.input_ids[p.query_start_loc[i + 1] - k];
      for (int32_t j = 0; j < c; ++j) {
        const int64_t t = tokens[off + j];
        PAGEDKV_CHECK(t >= 0 && t <= std::numeric_limits<int32_t>::max(), "token_ids: entry ", i,
                      " token ", j, " is out of range (", t, ")");
        PAGEDKV_CHECK(j == c - 1 || t == draft[j], "token_ids: entry ", i, " token ", j, " (", t,
                      ") differs from its draft (", draft[j],
                      "); only the last emitted token may differ");
      }
    }
    off += static_cast<size_t>(c);
  }
  PAGEDKV_CHECK(off == num_tokens, "token_ids: ", num_tokens,
                " tokens, but num_accepted adds up to ", off);
}

// Appends each entry's emitted tokens (up to its stop), advances what is cached by the tokens
// whose KV this step kept, and gives back the blocks that held only rejected drafts.
void Scheduler::Impl::apply_accepted(const int64_t* tokens, const int32_t* counts) {
  const StepPlan& p = plan;
  appended.assign(static_cast<size_t>(p.num_seqs), 0);
  size_t off = 0;
  for (int32_t i = 0; i < p.num_seqs; ++i) {
    const int32_t c = counts[i];
    const int64_t* emitted = tokens + off;
    off += static_cast<size_t>(c);
    const int32_t slot = p.slots[i];
    if (slot < 0) continue;  // aborted since schedule()
    Request& req = *pool[static_cast<size_t>(slot)];
    const int32_t query = p.query_start_loc[i + 1] - p.query_start_loc[i];
    const int32_t rejected = c > 0 ? p.num_draft_tokens[i] - (c - 1) : 0;
    Finished f;
    while (f.reason == FinishReason::kNone && appended[i] < c) {
      const auto token = static_cast<int32_t>(emitted[appended[i]++]);
      req.tokens.push_back(token);
      f = decide_finish(req.params, req.num_generated(), token);
    }
    // KV kept: the fed tokens up to the last accepted draft (fewer when a stop came first).
    req.num_computed = std::min(req.num_computed + query - rejected, req.num_tokens());
    kv.cache_full_blocks(req);
    if (f.reason != FinishReason::kNone) {
      f.slot = slot;
      finished.push_back(f);
    } else if (rejected > 0) {
      kv.truncate(req, req.num_computed);
    }
  }
}

// ---- public API ---------------------------------------------------------------------------

Scheduler::Scheduler(const SchedulerConfig& config) : impl_(std::make_unique<Impl>(config)) {
  impl_->plan.scheduler = this;
}
Scheduler::~Scheduler() = default;

const SchedulerConfig& Scheduler::config() const { return impl_->config; }

int32_t Scheduler::add_request(const std::string& request_id, const int32_t* prompt,
                               size_t prompt_len, const RequestParams& params) {
  Impl& s = *impl_;
  s.check_new_request(request_id, prompt_len, params);
  PAGEDKV_CHECK(prompt != nullptr, "prompt_token_ids: null pointer for a prompt of ", prompt_len,
                " tokens");
  for (size_t i = 0; i < prompt_len; ++i) {
    PAGEDKV_CHECK(prompt[i] >= 0, "prompt_token_ids: token ", i, " is negative (", prompt[i], ")");
  }
  Request* r = s.new_request(request_id);
  r->params = params;
  r->priority = s.config.policy == SchedulingPolicy::kPriority ? params.priority : 0;
  r->tokens.assign(prompt, prompt_len);
  r->num_prompt_tokens = static_cast<int32_t>(prompt_len);
  r->prefill_target = r->num_prompt_tokens;
  r->state = RequestState::kWaiting;
  s.waiting.insert(r);
  return r->slot;
}

bool Scheduler::abort_request(const std::string& request_id) {
  Impl& s = *impl_;
  Request* r = s.find(request_id);
  if (r == nullptr) return false;
  s.drop_entries(r->slot);  // its entries in the pending / advanced step are skipped
  StepPlan& p = s.plan;
  p.preempted_slots.erase(std::remove(p.preempted_slots.begin(), p.preempted_slots.end(), r->slot),
                          p.preempted_slots.end());
  s.unlink(r);
  s.release(r);
  return true;
}

const StepPlan& Scheduler::schedule() {
  PAGEDKV_CHECK(!impl_->plan_pending,
                "schedule(): the previous plan was not passed to update() yet");
  impl_->schedule_step();
  return impl_->plan;
}

const std::vector<Finished>& Scheduler::update(const StepPlan& plan, const int64_t* sampled,
                                               size_t n) {
  Impl& s = *impl_;
  const StepPlan& p = s.plan;
  PAGEDKV_CHECK(&plan == &p, "plan: not a plan of this scheduler");
  PAGEDKV_CHECK(!s.unresolved, "update(): an advanced step awaits resolve()");
  if (p.num_seqs == 0) {
    s.finished.clear();
    return s.finished;
  }
  PAGEDKV_CHECK(s.plan_pending, "plan: this plan was already applied by update()");
  // Checked before anything changes, so a bad call leaves the plan pending.
  s.advanced_samples.resize(static_cast<size_t>(p.num_seqs));
  for (int32_t i = 0; i < p.num_seqs; ++i) s.advanced_samples[i] = p.sample_indices[i] >= 0;
  s.check_sampled(p.slots.data(), s.advanced_samples.data(), static_cast<size_t>(p.num_seqs),
                  sampled, n);
  advance(plan);
  return resolve(sampled, n);
}

void Scheduler::advance(const StepPlan& plan) {
  Impl& s = *impl_;
  const StepPlan& p = s.plan;
  PAGEDKV_CHECK(&plan == &p, "plan: not a plan of this scheduler");
  PAGEDKV_CHECK(!s.unresolved, "advance(): the previous advanced step was not resolved yet");
  if (p.num_seqs == 0) return;
  PAGEDKV_CHECK(s.plan_pending, "plan: this plan was already applied by update()");
  for (int32_t i = 0; i < p.num_seqs; ++i) {  // (a failed step aborts them all: allowed)
    PAGEDKV_CHECK(p.slots[i] < 0 || p.num_draft_tokens[i] == 0, "plan: entry ", i,
                  " feeds draft tokens; pass the accepted tokens to update_accepted()");
  }
  const size_t n = static_cast<size_t>(p.num_seqs);
  s.advanced_slots.assign(p.slots.begin(), p.slots.begin() + p.num_seqs);
  s.advanced_samples.resize(n);
  bool any_done = false;
  for (size_t i = 0; i < n; ++i) {
    s.advanced_samples[i] = p.sample_indices[i] >= 0;
    const int32_t slot = p.slots[i];
    if (slot < 0) continue;  // aborted since schedule()
    Request& req = *s.pool[static_cast<size_t>(slot)];
    req.num_computed += p.query_start_loc[i + 1] - p.query_start_loc[i];
    s.kv.cache_full_blocks(req);
    if (!s.advanced_samples[i]) continue;
    req.tokens.push_back(-1 - static_cast<int32_t>(i));
    if (req.num_generated() >= req.params.max_tokens) {
      // Done whatever the token: not scheduled again, freed by resolve().
      req.state = RequestState::kFinishing;
      any_done = true;
    }
  }
  if (any_done) {
    s.running.erase(
        std::remove_if(s.running.begin(), s.running.end(),
                       [](const Request* r) { return r->state == RequestState::kFinishing; }),
        s.running.end());
  }
  s.plan_pending = false;
  s.unresolved = true;
}

const std::vector<Finished>& Scheduler::resolve(const int64_t* sampled, size_t n) {
  Impl& s = *impl_;
  PAGEDKV_CHECK(s.unresolved, "resolve(): no advanced step awaits its tokens");
  s.check_sampled(s.advanced_slots.data(), s.advanced_samples.data(), s.advanced_slots.size(),
                  sampled, n);
  s.finished.clear();
  for (size_t i = 0; i < n; ++i) {
    const int32_t slot = s.advanced_slots[i];
    if (slot < 0 || !s.advanced_samples[i]) continue;
    Request& req = *s.pool[static_cast<size_t>(slot)];
    const auto token = static_cast<int32_t>(sampled[i]);
    req.tokens.set_last_generated(token);
    Finished f = decide_finish(req.params, req.num_generated(), token);
    if (f.reason != FinishReason::kNone) {
      f.slot = slot;
      s.finished.push_back(f);
    }
  }
  s.unresolved = false;
  // Their slots (and Request objects) are recycled at the next schedule(): until then
  // request_id(slot) still names them and fork() can still read a finished parent.
  for (const Finished& f : s.finished) {
    Request* r = s.pool[static_cast<size_t>(f.slot)].get();
    s.drop_entries(f.slot);  // a plan scheduled since the advance() ran it on
    s.unlink(r);
    s.release(r, false);
  }
  return s.finished;
}

const std::vector<Finished>& Scheduler::update_accepted(const StepPlan& plan, const int64_t* tokens,
                                                        size_t num_tokens, const int32_t* counts,
                                                        size_t n) {
  Impl& s = *impl_;
  const StepPlan& p = s.plan;
  PAGEDKV_CHECK(&plan == &p, "plan: not a plan of this scheduler");
  PAGEDKV_CHECK(!s.unresolved, "update_accepted(): an advanced step awaits resolve()");
  s.finished.clear();
  if (p.num_seqs == 0) return s.finished;
  PAGEDKV_CHECK(s.plan_pending, "plan: this plan was already applied by update()");
  s.check_accepted(tokens, num_tokens, counts, n);
  s.apply_accepted(tokens, counts);
  s.plan_pending = false;
  // As in resolve(): recycled at the next schedule(), readable until then.
  for (const Finished& f : s.finished) {
    Request* r = s.pool[static_cast<size_t>(f.slot)].get();
    s.unlink(r);
    s.release(r, false);
  }
  return s.finished;
}

const std::vector<int32_t>& Scheduler::num_appended() const { return impl_->appended; }

bool Scheduler::has_unresolved_step() const { return impl_->unresolved; }

Finished Scheduler::would_finish(const std::string& request_id, int32_t token) const {
  const Request* r = impl_->find(request_id);
  PAGEDKV_CHECK(r != nullptr, "request_id: unknown request '", request_id, "'");
  return decide_finish(r->params, r->num_generated() + 1, token);
}

std::vector<std::string> Scheduler::update(const StepPlan& plan,
                                           const std::vector<int64_t>& sampled) {
  std::vector<std::string> ids;
  for (const Finished& f : update(plan, sampled.data(), sampled.size())) {
    ids.push_back(request_id(f.slot));
  }
  return ids;
}

Finished Scheduler::fork(const std::string& parent_id, const std::string& child_id,
                         int32_t first_token) {
  Impl& s = *impl_;
  Request* parent = s.find(parent_id);
  if (parent == nullptr) parent = s.just_finished(parent_id);
  PAGEDKV_CHECK(parent != nullptr, "parent_id: unknown request '", parent_id, "'");
  PAGEDKV_CHECK(s.by_id.find(child_id) == s.by_id.end(), "child_id: '", child_id,
                "' is already in use");
  // Running with its prompt in the cache: the child shares its blocks. Finished, or preempted
  // by a step scheduled since (overlap), it re-prefills.
  const bool live =
      parent->state == RequestState::kRunning && parent->num_computed == parent->num_prompt_tokens;
  PAGEDKV_CHECK(parent->state != RequestState::kFinishing && parent->num_generated() == 1 &&
                    parent->num_computed <= parent->num_prompt_tokens,
                "parent_id: fork '", parent_id,
                "' right after the update() that completed its prompt (it has ",
                parent->num_generated(), " generated tokens)");
  PAGEDKV_CHECK(first_token >= 0, "first_token must be >= 0, got ", first_token);
  Finished done = decide_finish(parent->params, 1, first_token);
  if (done.reason != FinishReason::kNone) return done;  // it never needs a seat or blocks
  Request* child = s.new_request(child_id);
  child->params = parent->params;
  child->priority = parent->priority;
  child->num_prompt_tokens = parent->num_prompt_tokens;
  child->tokens.share_prompt(parent->tokens);  // not a copy: the prompt is read-only
  child->tokens.push_back(first_token);
  if (live && s.running.size() < static_cast<size_t>(s.config.max_num_seqs)) {
    s.kv.share_prefix(*parent, *child, parent->num_prompt_tokens);
    child->num_computed = child->prefill_target = child->num_prompt_tokens;
    child->state = RequestState::kRunning;
    s.insert_running(child);
  } else {
    // No seat this step, or the parent's blocks are gone: wait like a preempted request,
    // keeping the tokens; the prefix cache usually still holds the prompt.
    child->num_computed = 0;
    child->prefill_target = child->num_tokens();
    child->state = RequestState::kWaiting;
    s.waiting.insert(child);
  }
  return done;
}

void Scheduler::set_draft_tokens(const std::string& request_id, const int32_t* tokens, size_t n) {
  Request* r = impl_->find(request_id);
  PAGEDKV_CHECK(r != nullptr, "request_id: unknown request '", request_id, "'");
  PAGEDKV_CHECK(tokens != nullptr || n == 0, "draft_token_ids: null pointer for ", n, " tokens");
  for (size_t i = 0; i < n; ++i) {
    PAGEDKV_CHECK(tokens[i] >= 0, "draft_token_ids: token ", i, " is negative (", tokens[i], ")");
  }
  r->draft.assign(tokens, tokens + n);
}

const std::string& Scheduler::request_id(int32_t slot) const {
  if (slot < 0 || static_cast<size_t>(slot) >= impl_->pool.size()) {
    throw std::out_of_range("slot: no such request slot");
  }
  return impl_->pool[static_cast<size_t>(slot)]->id;
}

int32_t Scheduler::slot_of(const std::string& id) const {
  const Request* r = impl_->find(id);
  return r == nullptr ? -1 : r->slot;
}

bool Scheduler::has_request(const std::string& id) const { return impl_->find(id) != nullptr; }

std::vector<int32_t> Scheduler::get_token_ids(const std::string& id) const {
  const Request* r = impl_->find(id);
  PAGEDKV_CHECK(r != nullptr, "request_id: unknown request '", id, "'");
  return r->tokens.to_vector();
}
int32_t Scheduler::get_num_generated(const std::string& id) const {
  const Request* r = impl_->find(id);
  PAGEDKV_CHECK(r != nullptr, "request_id: unknown request '", id, "'");
  return r->num_generated();
}

bool Scheduler::has_unfinished_requests() const { return !impl_->by_id.empty(); }
int32_t Scheduler::num_running() const { return static_cast<int32_t>(impl_->running.size()); }
int32_t Scheduler::num_waiting() const { return static_cast<int32_t>(impl_->waiting.size()); }
int32_t Scheduler::num_swapped() const { return static_cast<int32_t>(impl_->swapped.size()); }
int32_t Scheduler::num_free_blocks() const { return impl_->kv.num_free_blocks(); }
double Scheduler::kv_cache_usage() const {
  return 1.0 - static_cast<double>(impl_->kv.num_free_blocks()) / impl_->config.num_blocks;
}
const SchedulerCounters& Scheduler::counters() const { return impl_->counters; }
const BlockAllocator& Scheduler::allocator() const { return impl_->kv.allocator(); }

}  // namespace pagedkv
