// StepPlanBuilder: fills a StepPlan's preallocated buffers from the scheduled entries
// (internal). Block-table rows are updated incrementally: a row that holds the same request as
// in the previous step, with blocks only appended since, gets just its new blocks written.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedkv/scheduler_config.h"
#include "pagedkv/step_plan.h"
#include "request.h"

namespace pagedkv {

struct ScheduledEntry {
  Request* req;
  int32_t num_tokens;     // query length this step
  bool prefill;           // laid out with the prefills (several query tokens: extend path)
  int32_t num_draft = 0;  // draft tokens fed after the sequence's last token (speculative decode)
};

class StepPlanBuilder {
 public:
  StepPlanBuilder(const SchedulerConfig& config, StepPlan* plan);

  // Resets the per-step parts of the plan (keeps the buffers) and bumps its step id.
  void begin_step();
  // Lays out `entries` (any order) as prefills first, then decodes.
  void build(const std::vector<ScheduledEntry>& entries);

 private:
  void add_entry(const ScheduledEntry& e, int32_t row);
  void write_block_row(const Request& req, int32_t row);

  StepPlan* plan_;
  int32_t block_size_;
  int32_t width_;
  // Per block-table row: which request it holds, at which table version, and how many entries
  // were written (entries past it are padding).
  std::vector<const Request*> row_req_;
  std::vector<uint64_t> row_version_;
  std::vector<int32_t> row_len_;
};

}  // namespace pagedkv
