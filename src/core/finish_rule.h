// The finishing rule of a sequence (internal): the one place that decides when EOS ids, stop
// ids, min_tokens and max_tokens end it. The engine asks the scheduler (update(), resolve(),
// would_finish()); nothing mirrors this rule elsewhere.
#pragma once

#include <algorithm>
#include <cstdint>

#include "pagedkv/finish_reason.h"
#include "pagedkv/scheduler.h"

namespace pagedkv {

// Why a sequence with `params` finishes when `token` becomes its generated token number
// `num_generated` (1-based), or kNone. A stop id wins over an EOS id (it names the stop
// reason), and either over max_tokens; neither stops before min_tokens.
inline Finished decide_finish(const RequestParams& p, int32_t num_generated, int32_t token) {
  Finished f;
  if (num_generated >= p.min_tokens) {
    const auto& stops = p.stop_token_ids;
    const auto& eos = p.eos_token_ids;
    if (std::find(stops.begin(), stops.end(), token) != stops.end()) {
      f.reason = FinishReason::kStopToken;
      f.stop_token_id = token;
      return f;
    }
    if (!p.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end()) {
      f.reason = FinishReason::kEos;
      return f;
    }
  }
  if (num_generated >= p.max_tokens) f.reason = FinishReason::kLength;
  return f;
}

}  // namespace pagedkv
