// Tests of argument checks: the message an API call raises, to match against.
#pragma once

#include <stdexcept>
#include <string>

namespace pagedkv::testing {

// The message of the std::invalid_argument `fn` throws ("" when it throws nothing).
template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace pagedkv::testing
