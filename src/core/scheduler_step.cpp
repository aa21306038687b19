// The per-step policy of the Scheduler: which sequences run, how many tokens each, who is
// preempted. See scheduler.h for the rules.
#include <algorithm>

#include "scheduler_impl.h"

namespace pagedkv {

void Scheduler::Impl::schedule_step() {
  builder.begin_step();
  free_slots.insert(free_slots.end(), finished_slots.begin(), finished_slots.end());
  finished_slots.clear();
  entries.clear();
  admitted.clear();

  int32_t budget = config.max_num_batched_tokens;
  bool preempted = false;
  if (config.policy == SchedulingPolicy::kPriority) preempt_for_priority();
  schedule_running(&budget, &preempted);
  // A step that preempted admits nothing: the freed room goes to the running sequences.
  if (!preempted) schedule_queued(&budget);
  for (Request* req : admitted) insert_running(req);

  BlockPairs copies = kv.allocator().take_pending_copies();
  plan.blocks_to_copy.swap(copies);
  builder.build(entries);
  for (const ScheduledEntry& e : entries) {
    e.req->num_scheduled = 0;
    e.req->draft.clear();  // consumed: update() verifies against the plan's input_ids
  }
  plan_pending = plan.num_seqs > 0;
}

// Running sequences: decodes first (one token each), then prompt chunks already under way.
void Scheduler::Impl::schedule_running(int32_t* budget, bool* preempted) {
  size_t num_prefilling = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const bool prefills = pass == 1;
    if (prefills && num_prefilling == 0) return;
    size_t i = 0;
    while (i < running.size() && *budget > 0) {
      Request* req = running[i];
      if (req->num_scheduled > 0 || req->in_prefill() != prefills) {
        num_prefilling += req->in_prefill() ? 1 : 0;
        ++i;
        continue;
      }
      int32_t num_new = req->num_tokens() - req->num_computed;
      if (num_new > *budget) {
        if (!config.enable_chunked_prefill && prefills) {
          ++i;
          continue;
        }
        num_new = *budget;
      }
      // A decode feeds its drafts too (speculative decoding), budget and room permitting.
      int32_t num_draft = prefills ? 0 : usable_drafts(*req, *budget - num_new);
      num_new += num_draft;
      bool self_preempted = false;
      while (!kv.ensure_slots(*req, req->num_computed + num_new)) {
        if (num_draft > 0) {  // drafts are optional: drop them before preempting anyone
          num_new -= num_draft;
          num_draft = 0;
          continue;
        }
        Request* victim = pick_victim();
        preempt(victim);
        *preempted = true;
        if (victim == req) {
          self_preempted = true;
          break;
        }
      }
      if (self_preempted) continue;  // running[i] is now the next sequence
      req->num_scheduled = num_new;
      // A decode with drafts has a multi-token query: it runs with the prefills (extend path).
      entries.push_back({req, num_new, prefills || num_draft > 0, num_draft});
      *budget -= num_new;
      ++i;
    }
  }
}

// How many of req's drafts a decode can feed: within the step's remaining budget, and never
// past max_tokens (a token after the last one is never emitted, and the request's longest
// cache, checked at admission, stays prompt + max_tokens - 1).
int32_t Scheduler::Impl::usable_drafts(const Request& req, int32_t budget_left) const {
  const int32_t room = req.params.max_tokens - req.num_generated() - 1;
  const int32_t k = std::min({static_cast<int32_t>(req.draft.size()), budget_left, room});
  return std::max(k, 0);
}

// Priority policy: a waiting request that outranks the lowest-priority running one, and does
// not fit now (no seat, or too few free blocks for its first chunk), takes that one's place.
// The victims rank below it, so they queue behind it and cannot bounce it back out.
void Scheduler::Impl::preempt_for_priority() {
  while (!waiting.empty() && !running.empty()) {
    Request* w = *waiting.begin();
    Request* victim = running.back();
    if (w->priority >= victim->priority) return;  // strictly higher priority only
    const bool seat = running.size() < static_cast<size_t>(config.max_num_seqs);
    const int32_t first_chunk =
        std::min(w->num_tokens(), config.max_num_batched_tokens);  // ignores prefix hits
    if (seat && kv.blocks_for(first_chunk) <= kv.num_free_blocks()) return;
    preempt(victim);
  }
}

// The lowest-priority / latest-arrived running sequence not yet scheduled in this step (the
// one asking for room is always a candidate, so there is one).
Request* Scheduler::Impl::pick_victim() {
  for (auto it = running.rbegin(); it != running.rend(); ++it) {
    if ((*it)->num_scheduled == 0) return *it;
  }
  return nullptr;  // unreachable: the caller is unscheduled and running
}

void Scheduler::Impl::preempt(Request* victim) {
  erase_running(victim);
  ++counters.num_preemptions;
  ++victim->num_preemptions;
  victim->draft.clear();  // proposed for a state it leaves; the engine proposes again later
  if (config.preemption_mode == PreemptionMode::kSwap &&
      kv.swap_out(*victim, &plan.blocks_to_swap_out)) {
    victim->state = RequestState::kSwapped;
    swapped.insert(victim);
    return;
  }
  // Recompute (or no host room): it keeps its tokens and its place in the queue, and
  // re-prefills prompt + generated tokens when resumed.
  kv.free_blocks(*victim);
  victim->num_computed = 0;
  victim->prefill_target = victim->num_tokens();
  victim->state = RequestState::kWaiting;
  waiting.insert(victim);
  plan.preempted_slots.push_back(victim->slot);
}

// Swapped-out and waiting sequences, merged in queue order (priority, arrival); stops at the
// first that does not fit (head-of-line), so nothing overtakes a request that waits for room.
void Scheduler::Impl::schedule_queued(int32_t* budget) {
  const size_t max_seqs = static_cast<size_t>(config.max_num_seqs);
  while (*budget > 0 && running.size() + admitted.size() < max_seqs) {
    Request* sw = swapped.empty() ? nullptr : *swapped.begin();
    Request* wt = waiting.empty() ? nullptr : *waiting.begin();
    if (sw == nullptr && wt == nullptr) return;
    const bool ok = sw != nullptr && (wt == nullptr || RequestKeyLess()(sw, wt))
                        ? try_swap_in(sw, budget)
                        : try_admit(wt, budget);
    if (!ok) return;
  }
}

// A swapped-out sequence comes back when its blocks and the next chunk's fit.
bool Scheduler::Impl::try_swap_in(Request* req, int32_t* budget) {
  int32_t num_new = req->num_tokens() - req->num_computed;
  if (num_new > *budget) {
    if (!config.enable_chunked_prefill && req->in_prefill()) return false;
    num_new = *budget;
  }
  const int32_t held = static_cast<int32_t>(req->cpu_blocks.size());
  const int32_t grow = std::max(kv.blocks_for(req->num_computed + num_new) - held, 0);
  if (held + grow > kv.num_free_blocks()) return false;
  if (!kv.swap_in(*req, &plan.blocks_to_swap_in)) return false;  // stays swapped out
  swapped.erase(req);
  req->state = RequestState::kRunning;
  admitted.push_back(req);
  // Room was checked above; should the allocator still refuse, it runs from the next step on
  // (where the running loop can preempt for it) instead of being scheduled without slots.
  if (!kv.ensure_slots(*req, req->num_computed + num_new)) return false;
  req->num_scheduled = num_new;
  entries.push_back({req, num_new, req->in_prefill()});
  *budget -= num_new;
  return true;
}

// A waiting sequence (new or recompute-preempted): reuse its cached prefix, then take blocks
// for its first chunk (or, when resuming, for its whole remaining prefill).
bool Scheduler::Impl::try_admit(Request* req, int32_t* budget) {
  const int32_t hit = kv.match_prefix(*req);
  int32_t chunk = req->num_tokens() - req->num_computed;
  bool fits = true;
  if (chunk > *budget) {
    fits = config.enable_chunked_prefill;
    chunk = *budget;
  }
  int32_t reserve = req->num_computed + chunk;
  if (req->num_preemptions > 0) {
    // Resume only when the whole remaining prefill and the next token fit, so that it is
    // not preempted again right away (preemption storms).
    reserve = std::max(reserve, std::min(req->num_tokens() + 1, req->max_cached_tokens()));
  }
  if (!fits || !kv.ensure_slots(*req, reserve)) {
    kv.free_blocks(*req);  // give the matched prefix back
    req->num_computed = 0;
    return false;
  }
  waiting.erase(req);
  counters.prefix_cache_query_tokens += req->num_tokens();
  counters.prefix_cache_hit_tokens += hit;
  req->state = RequestState::kRunning;
  req->num_scheduled = chunk;
  admitted.push_back(req);
  entries.push_back({req, chunk, true});
  *budget -= chunk;
  return true;
}

void Scheduler::Impl::insert_running(Request* req) {
  running.insert(std::upper_bound(running.begin(), running.end(), req, RequestKeyLess()), req);
}

void Scheduler::Impl::erase_running(Request* req) {
  auto it = std::lower_bound(running.begin(), running.end(), req, RequestKeyLess());
  if (it != running.end() && *it == req) running.erase(it);
}

}  // namespace pagedkv
