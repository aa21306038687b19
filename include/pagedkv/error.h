// Errors raised by pagedkv's public API.
//
// Argument errors are exceptions derived from std::invalid_argument, so C++ callers can catch
// them with the standard type and the Python bindings map them to ValueError / TypeError. The
// allocator's hot path does not throw: it returns status values instead (see block_allocator.h).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace pagedkv {

// A value is out of its valid range or inconsistent with other arguments (Python: ValueError).
class ValueError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// An argument has the wrong type, e.g. an unsupported dtype (Python: TypeError).
class TypeError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace pagedkv

// Throws pagedkv::ValueError with a message built from the remaining arguments when `cond` fails.
#define PAGEDKV_CHECK(cond, ...) \
  do {                           \
    if (!(cond)) throw ::pagedkv::ValueError(::pagedkv::detail::concat(__VA_ARGS__)); \
  } while (0)

#define PAGEDKV_CHECK_TYPE(cond, ...) \
  do {                                \
    if (!(cond)) throw ::pagedkv::TypeError(::pagedkv::detail::concat(__VA_ARGS__)); \
  } while (0)
