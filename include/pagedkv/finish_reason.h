// FinishReason: why the scheduler ended a sequence, decided in one place (finish_rule.h) and
// reported by Scheduler::update() / resolve() / fork().
#pragma once

#include <cstdint>

namespace pagedkv {

enum class FinishReason : uint8_t {
  kNone = 0,   // still running
  kEos,        // sampled one of the request's EOS ids (after min_tokens, unless ignore_eos)
  kStopToken,  // sampled one of its stop_token_ids (after min_tokens)
  kLength,     // reached max_tokens
};

// vLLM's finish_reason string: "stop" for EOS and stop ids, "length", or nullptr for kNone.
inline const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kEos:
    case FinishReason::kStopToken: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kNone: break;
  }
  return nullptr;
}

// A sequence that finished: its slot (Scheduler::request_id), why, and for kStopToken the stop
// id that ended it (-1 otherwise; an EOS is not a user stop id, as in vLLM's stop_reason).
struct Finished {
  int32_t slot = -1;
  FinishReason reason = FinishReason::kNone;
  int32_t stop_token_id = -1;
};

}  // namespace pagedkv
