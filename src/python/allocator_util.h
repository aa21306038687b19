// Helpers shared by the BlockAllocator bindings (bind_allocator.cpp, bind_prefix_cache.cpp): hash
// tuples, [n, 2] int64 mappings, id validation and status -> exception mapping.
#pragma once

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <climits>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pagedkv/block_allocator.h"
#include "pagedkv/error.h"
#include "python/bindings.h"
#include "python/int_arg.h"

// Type of `tokens` arguments in the generated stubs (nb::sig).
#define PAGEDKV_TOKENS_T "collections.abc.Sequence[int] | numpy.typing.NDArray[numpy.int32]"

namespace pagedkv::python {

namespace nb = nanobind;

using HashTuple = std::tuple<uint64_t, uint64_t>;
using Pairs = std::vector<std::pair<int64_t, int64_t>>;
using Mapping = nb::ndarray<nb::numpy, int64_t, nb::shape<-1, 2>>;
using Tokens = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

inline HashTuple to_tuple(const BlockHash& h) { return {h.lo, h.hi}; }
inline BlockHash to_hash(const std::optional<HashTuple>& t) {
  return t ? BlockHash{std::get<0>(*t), std::get<1>(*t)} : kRootHash;
}

// [n, 2] int64 numpy array owning a copy of the pairs.
inline Mapping to_numpy(const Pairs& pairs) {
  auto* buf = new int64_t[pairs.size() * 2 + 1];  // +1: never a zero-size allocation
  for (size_t i = 0; i < pairs.size(); ++i) {
    buf[2 * i] = pairs[i].first;
    buf[2 * i + 1] = pairs[i].second;
  }
  nb::capsule owner(buf, [](void* p) noexcept { delete[] static_cast<int64_t*>(p); });
  return Mapping(buf, {pairs.size(), 2}, owner);
}

// Ids given from Python (int64 so that huge values are reported as out of range, not as an
// overflow), narrowed after a range check against `limit`.
inline std::vector<BlockId> to_ids(const std::vector<int64_t>& ids, int64_t limit,
                                   const char* arg) {
  std::vector<BlockId> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    PAGEDKV_CHECK(ids[i] >= 0 && ids[i] < limit, arg, ": block id ", ids[i], " at index ", i,
                  " is out of range [0, ", limit, ")");
    out[i] = static_cast<BlockId>(ids[i]);
  }
  return out;
}

// Ids given as a Python sequence of ints (list, tuple, numpy array, ...): a TypeError naming the
// argument for anything else (instead of nanobind's signature dump), then as above.
inline std::vector<BlockId> to_ids(nb::handle ids, int64_t limit, const char* arg) {
  std::vector<int64_t> v;
  nb::object seq = nb::borrow(ids);
  if (nb::hasattr(seq, "tolist") && !nb::isinstance<nb::list>(seq)) seq = seq.attr("tolist")();
  if (nb::isinstance<nb::str>(seq) || !nb::try_cast(seq, v)) {
    throw TypeError(detail::concat(arg, " must be a sequence of int block ids, got ",
                                   nb::type_name(ids.type()).c_str()));
  }
  return to_ids(v, limit, arg);
}

// One id given as a Python int (or integer scalar), checked against `limit`.
inline std::vector<BlockId> to_id(nb::handle id, int64_t limit, const char* arg) {
  return to_ids(std::vector<int64_t>{int_arg<int64_t>(id, arg)}, limit, arg);
}

// A 64-bit unsigned key (extra_key): an int in [0, 2**64), named in the error otherwise.
inline uint64_t to_key(nb::handle key, const char* arg) {
  PyObject* index = PyNumber_Index(key.ptr());
  if (index == nullptr) {
    PyErr_Clear();
    throw TypeError(
        detail::concat(arg, " must be an integer, got ", nb::type_name(key.type()).c_str()));
  }
  const nb::object i = nb::steal(index);
  uint64_t v = 0;
  if (!nb::try_cast(i, v, false)) {
    throw ValueError(detail::concat(arg, " = ", nb::str(key).c_str(),
                                    " is out of range: it must be in [0, 2**64)"));
  }
  return v;
}

// A parent hash: None (the root) or a (lo, hi) pair of 64-bit unsigned ints.
inline BlockHash to_parent(nb::handle parent) {
  if (parent.is_none()) return kRootHash;
  HashTuple t;
  if (!nb::try_cast(parent, t, false)) {
    throw TypeError(
        detail::concat("parent must be None or a (lo, hi) tuple of two ints in "
                       "[0, 2**64) (a hash from cache_full_block), got ",
                       nb::str(parent).c_str()));
  }
  return to_hash(t);
}

// Turns a failed status into a Python exception whose message names the argument and, for ref-count
// errors, the offending id (found by replaying the decrements).
template <typename RefFn>
[[noreturn]] void raise(Status s, const char* arg, const std::vector<BlockId>& ids, RefFn ref) {
  if (s == Status::kOutOfBlocks) {
    std::string msg = detail::concat(arg, ": ", status_message(s), " for ", ids.size(), " blocks");
    PyErr_SetString(PyExc_MemoryError, msg.c_str());
    throw nb::python_error();
  }
  if (s == Status::kNotAllocated) {
    std::unordered_map<BlockId, int32_t> seen;
    for (BlockId id : ids) {
      if (++seen[id] <= ref(id)) continue;
      if (ref(id) == 0)
        throw ValueError(detail::concat(arg, ": block ", id,
                                        " is not allocated (ref count 0): double free or never "
                                        "allocated"));
      throw ValueError(detail::concat(arg, ": block ", id,
                                      " is listed more times than its ref "
                                      "count (",
                                      ref(id), ")"));
    }
  }
  throw ValueError(detail::concat(arg, ": ", status_message(s)));
}

inline void check_count(int64_t n, const char* arg) {
  PAGEDKV_CHECK(n >= 0, arg, " must be >= 0, got ", n);
  PAGEDKV_CHECK(n <= INT32_MAX, arg, " must fit in int32, got ", n);
}

// Token ids from a 1-D C-contiguous int32 CPU array (read in place) or any sequence of ints.
struct TokenSpan {
  const int32_t* data = nullptr;
  size_t size = 0;
  std::vector<int32_t> storage;
};

inline TokenSpan to_tokens(nb::handle obj, const char* arg) {
  TokenSpan t;
  Tokens arr;
  if (nb::try_cast<Tokens>(obj, arr, /*convert=*/false)) {
    t.data = arr.data();
    t.size = arr.shape(0);
    return t;
  }
  if (!nb::try_cast<std::vector<int32_t>>(obj, t.storage, /*convert=*/true))
    throw TypeError(detail::concat(arg,
                                   " must be a sequence of int32 token ids or a 1-D int32 "
                                   "array"));
  t.data = t.storage.data();
  t.size = t.storage.size();
  return t;
}

void bind_prefix_cache(nb::class_<BlockAllocator>& cls);  // bind_prefix_cache.cpp

}  // namespace pagedkv::python
