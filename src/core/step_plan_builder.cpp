// StepPlanBuilder: see step_plan_builder.h.
#include "step_plan_builder.h"

#include <algorithm>
#include <cstring>
#include <new>

namespace pagedkv {

StepPlanBuilder::StepPlanBuilder(const SchedulerConfig& config, StepPlan* plan)
    : plan_(plan), block_size_(config.block_size), width_(config.max_blocks_per_seq()) {
  const size_t tokens = static_cast<size_t>(config.max_num_batched_tokens);
  const size_t seqs = static_cast<size_t>(config.max_num_seqs);
  plan->max_blocks_per_seq = width_;
  plan->input_ids.resize(tokens);
  plan->positions.resize(tokens);
  plan->slot_mapping.resize(tokens);
  plan->seq_lens.resize(seqs);
  plan->context_lens.resize(seqs);
  plan->query_start_loc.resize(seqs + 1);
  plan->seq_start_loc.resize(seqs + 1);
  plan->sample_indices.resize(seqs);
  plan->slots.resize(seqs);
  plan->num_draft_tokens.resize(seqs);
  // calloc: zero pages are mapped lazily, so a wide table costs only the rows in use, and the
  // padding (kBlockTablePad == 0) is already in place.
  static_assert(kBlockTablePad == 0, "calloc provides the padding");
  void* table = std::calloc(seqs * static_cast<size_t>(width_), sizeof(int32_t));
  if (table == nullptr) throw std::bad_alloc();
  plan->block_tables.reset(static_cast<int32_t*>(table));
  row_req_.assign(seqs, nullptr);
  row_version_.assign(seqs, 0);
  row_len_.assign(seqs, 0);
}

void StepPlanBuilder::begin_step() {
  StepPlan& p = *plan_;
  ++p.step;
  p.num_seqs = p.num_prefills = p.num_prefill_tokens = p.num_decode_tokens = p.num_tokens = 0;
  p.max_query_len = p.max_prefill_seq_len = p.max_decode_seq_len = 0;
  p.num_draft_tokens_total = 0;
  p.query_start_loc[0] = 0;
  p.seq_start_loc[0] = 0;
  p.blocks_to_swap_out.clear();
  p.blocks_to_swap_in.clear();
  p.blocks_to_copy.clear();
  p.preempted_slots.clear();
}

void StepPlanBuilder::build(const std::vector<ScheduledEntry>& entries) {
  int32_t row = 0;
  for (const ScheduledEntry& e : entries) {
    if (e.prefill) add_entry(e, row++);
  }
  plan_->num_prefills = row;
  for (const ScheduledEntry& e : entries) {
    if (!e.prefill) add_entry(e, row++);
  }
  plan_->num_seqs = row;
}

void StepPlanBuilder::add_entry(const ScheduledEntry& e, int32_t row) {
  StepPlan& p = *plan_;
  const Request& req = *e.req;
  const int32_t ctx = req.num_computed;
  const int32_t seq_len = ctx + e.num_tokens;
  const int32_t start = p.num_tokens;

  // The sequence's own tokens, then its drafts (which are not part of req.tokens).
  const int32_t own = e.num_tokens - e.num_draft;
  req.tokens.copy_to(static_cast<size_t>(ctx), static_cast<size_t>(own),
                     &p.input_ids[static_cast<size_t>(start)]);
  std::copy_n(req.draft.data(), e.num_draft, &p.input_ids[static_cast<size_t>(start + own)]);
  const BlockId* blocks = req.blocks.data();
  for (int32_t t = 0; t < e.num_tokens; ++t) {
    const int32_t pos = ctx + t;
    p.positions[start + t] = pos;
    p.slot_mapping[start + t] =
        static_cast<int64_t>(blocks[pos / block_size_]) * block_size_ + pos % block_size_;
  }
  p.num_tokens = start + e.num_tokens;
  p.seq_lens[row] = seq_len;
  p.context_lens[row] = ctx;
  p.query_start_loc[row + 1] = p.num_tokens;
  p.seq_start_loc[row + 1] = p.seq_start_loc[row] + seq_len;
  p.sample_indices[row] = seq_len - e.num_draft == req.num_tokens() ? p.num_tokens - 1 : -1;
  p.slots[row] = req.slot;
  p.num_draft_tokens[row] = e.num_draft;
  p.num_draft_tokens_total += e.num_draft;
  p.max_query_len = std::max(p.max_query_len, e.num_tokens);
  if (e.prefill) {
    p.num_prefill_tokens += e.num_tokens;
    p.max_prefill_seq_len = std::max(p.max_prefill_seq_len, seq_len);
  } else {
    p.num_decode_tokens += e.num_tokens;
    p.max_decode_seq_len = std::max(p.max_decode_seq_len, seq_len);
  }
  write_block_row(req, row);
}

void StepPlanBuilder::write_block_row(const Request& req, int32_t row) {
  int32_t* dst = plan_->block_tables.get() + static_cast<int64_t>(row) * width_;
  const int32_t n = static_cast<int32_t>(req.blocks.size());
  int32_t from = 0;
  if (row_req_[row] == &req && row_version_[row] == req.table_version && row_len_[row] <= n) {
    from = row_len_[row];  // same request, blocks only appended since: write the new ones
  }
  if (n > from) {
    std::memcpy(dst + from, req.blocks.data() + from, sizeof(int32_t) * (n - from));
  }
  if (row_len_[row] > n) {
    std::fill(dst + n, dst + row_len_[row], kBlockTablePad);
  }
  row_req_[row] = &req;
  row_version_[row] = req.table_version;
  row_len_[row] = n;
}

}  // namespace pagedkv
