// Errors raised by pagedkv's public API.
//
// Argument errors are exceptions derived from std::invalid_argument, so C++ callers can catch
// them with the standard type and the Python bindings map them to ValueError / TypeError. The
// allocator's hot path does not throw: it returns status values instead (see block_allocator.h).
#pragma once

#include <charconv>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

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
// Error messages are built by plain string appends, not iostreams: an ostream formats numbers
// through the global locale, which is shared with every other library in the host process (a
// Python interpreter with torch, CUDA and friends loaded), and a fault there would turn a
// ValueError into a crash. std::to_chars touches no shared state.
inline void append(std::string& s, std::string_view v) { s.append(v.data(), v.size()); }
inline void append(std::string& s, const char* v) { s.append(v ? v : "(null)"); }
inline void append(std::string& s, char c) { s.push_back(c); }
inline void append(std::string& s, bool b) { s.append(b ? "true" : "false"); }
template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
void append(std::string& s, T v) {
  char buf[24];
  s.append(buf, std::to_chars(buf, buf + sizeof(buf), v).ptr);
}
template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
void append(std::string& s, T v) {
  char buf[32];
  int n = std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v));
  s.append(buf, n > 0 ? static_cast<size_t>(n) : 0);
}

template <typename... Args>
std::string concat(const Args&... args) {
  std::string s;
  (append(s, args), ...);
  return s;
}
}  // namespace detail

}  // namespace pagedkv

// Throws pagedkv::ValueError with a message built from the remaining arguments when `cond` fails.
#define PAGEDKV_CHECK(cond, ...)                                                      \
  do {                                                                                \
    if (!(cond)) throw ::pagedkv::ValueError(::pagedkv::detail::concat(__VA_ARGS__)); \
  } while (0)

#define PAGEDKV_CHECK_TYPE(cond, ...)                                                \
  do {                                                                               \
    if (!(cond)) throw ::pagedkv::TypeError(::pagedkv::detail::concat(__VA_ARGS__)); \
  } while (0)
