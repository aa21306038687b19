// SchedulerConfig validation.
#include "pagedkv/scheduler_config.h"

#include <algorithm>
#include <limits>

#include "pagedkv/error.h"

namespace pagedkv {

int32_t SchedulerConfig::effective_max_model_len() const {
  int64_t len = max_model_len > 0
                    ? max_model_len
                    : static_cast<int64_t>(num_blocks) * static_cast<int64_t>(block_size);
  if (max_model_len <= 0 && !enable_chunked_prefill) {
    len = std::min<int64_t>(len, max_num_batched_tokens);
  }
  return static_cast<int32_t>(std::min<int64_t>(len, std::numeric_limits<int32_t>::max()));
}

int32_t SchedulerConfig::max_blocks_per_seq() const {
  int64_t len = effective_max_model_len();
  return static_cast<int32_t>((len + block_size - 1) / block_size);
}

void SchedulerConfig::validate() const {
  PAGEDKV_CHECK(num_blocks > 0, "num_blocks must be > 0, got ", num_blocks);
  PAGEDKV_CHECK(block_size > 0, "block_size must be > 0, got ", block_size);
  PAGEDKV_CHECK(max_num_seqs > 0, "max_num_seqs must be > 0, got ", max_num_seqs);
  PAGEDKV_CHECK(max_num_batched_tokens > 0, "max_num_batched_tokens must be > 0, got ",
                max_num_batched_tokens);
  PAGEDKV_CHECK(num_cpu_blocks >= 0, "num_cpu_blocks must be >= 0, got ", num_cpu_blocks);
  PAGEDKV_CHECK(max_model_len >= 0, "max_model_len must be > 0 (or None), got ", max_model_len);
  PAGEDKV_CHECK(preemption_mode != PreemptionMode::kSwap || num_cpu_blocks > 0,
                "num_cpu_blocks must be > 0 when preemption_mode is 'swap'");
  PAGEDKV_CHECK(
      enable_chunked_prefill || max_model_len == 0 || max_model_len <= max_num_batched_tokens,
      "max_num_batched_tokens (", max_num_batched_tokens, ") must be >= max_model_len (",
      max_model_len, ") when enable_chunked_prefill is False: a prompt must fit one step");
  // Bound the block-table buffer (max_num_seqs rows of max_blocks_per_seq int32).
  int64_t table = static_cast<int64_t>(max_num_seqs) * max_blocks_per_seq();
  PAGEDKV_CHECK(table <= (int64_t{1} << 28),
                "max_model_len: max_num_seqs * ceil(max_model_len / block_size) = ", table,
                " block-table entries is too many; pass a smaller max_model_len");
}

}  // namespace pagedkv
