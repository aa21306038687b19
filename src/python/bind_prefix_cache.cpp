// Python bindings of the BlockAllocator's prefix cache (match, register, partial reuse) and its
// counters. Hashes are (lo, hi) int tuples; None or (0, 0) is the root parent.
#include <nanobind/stl/vector.h>

#include "python/allocator_util.h"

namespace pagedkv::python {
namespace {

int32_t to_cap(nb::handle cap, const char* arg) {
  if (cap.is_none()) return -1;  // no cap
  const int64_t n = int_arg<int64_t>(cap, arg);
  check_count(n, arg);
  return static_cast<int32_t>(n);
}

nb::typed<nb::dict, nb::str, int> stats(const BlockAllocator& a) {
  const AllocatorCounters& c = a.counters();
  nb::typed<nb::dict, nb::str, int> d;
  d["num_blocks"] = a.num_blocks();
  d["num_used_blocks"] = a.num_used_blocks();
  d["num_free_blocks"] = a.num_free_blocks();
  d["num_cached_blocks"] = a.num_cached_blocks();
  d["num_cached_free_blocks"] = a.num_cached_free_blocks();
  d["num_cpu_blocks"] = a.num_cpu_blocks();
  d["num_free_cpu_blocks"] = a.num_free_cpu_blocks();
  d["prefix_queries"] = c.prefix_queries;
  d["prefix_hit_queries"] = c.prefix_hit_queries;
  d["prefix_queries_tokens"] = c.prefix_queries_tokens;
  d["prefix_hits_tokens"] = c.prefix_hits_tokens;
  d["partial_hit_tokens"] = c.partial_hit_tokens;
  d["evictions"] = c.evictions;
  d["cow_copies"] = c.cow_copies;
  d["hash_collisions"] = c.hash_collisions;
  d["swapped_out_blocks"] = c.swapped_out_blocks;
  d["swapped_in_blocks"] = c.swapped_in_blocks;
  return d;
}

}  // namespace

void bind_prefix_cache(nb::class_<BlockAllocator>& cls) {
  cls.def(
      "match_prefix",
      [](BlockAllocator& a, nb::handle tokens, nb::handle extra_key_arg, nb::handle max_blocks) {
        TokenSpan t = to_tokens(tokens, "tokens");
        const uint64_t extra_key = to_key(extra_key_arg, "extra_key");
        int32_t cap = to_cap(max_blocks, "max_blocks");
        std::vector<BlockId> out;
        a.match_prefix(t.data, t.size, extra_key, cap, &out, nullptr);
        return out;
      },
      nb::sig("def match_prefix(self, tokens: " PAGEDKV_TOKENS_T
              ", extra_key: int = 0, max_blocks: int | None = None) -> list[int]"),
      nb::arg("tokens"), nb::arg("extra_key").none() = 0, nb::arg("max_blocks").none() = nb::none(),
      "Longest cached run of full blocks of `tokens` (at most max_blocks); "
      "each returned block "
      "gets one reference. Counts a query of len(tokens) tokens.");
  cls.def(
      "peek_prefix",
      [](const BlockAllocator& a, nb::handle tokens, nb::handle extra_key_arg,
         nb::handle max_blocks) {
        TokenSpan t = to_tokens(tokens, "tokens");
        const uint64_t extra_key = to_key(extra_key_arg, "extra_key");
        return a.peek_prefix(t.data, t.size, extra_key, to_cap(max_blocks, "max_blocks"));
      },
      nb::sig("def peek_prefix(self, tokens: " PAGEDKV_TOKENS_T
              ", extra_key: int = 0, max_blocks: int | None = None) -> int"),
      nb::arg("tokens"), nb::arg("extra_key").none() = 0, nb::arg("max_blocks").none() = nb::none(),
      "Number of blocks match_prefix would return now (takes no references, "
      "counts nothing).");
  cls.def(
      "match_prefix_partial",
      [](BlockAllocator& a, nb::handle tokens, nb::handle extra_key_arg, nb::handle max_tokens) {
        TokenSpan t = to_tokens(tokens, "tokens");
        const uint64_t extra_key = to_key(extra_key_arg, "extra_key");
        int32_t cap = to_cap(max_tokens, "max_tokens");
        std::vector<BlockId> out;
        int32_t n = a.match_prefix_tokens(t.data, t.size, extra_key, cap, &out, nullptr);
        return std::make_pair(out, n);
      },
      nb::sig("def match_prefix_partial(self, tokens: " PAGEDKV_TOKENS_T
              ", extra_key: int = 0, max_tokens: int | None = None) -> tuple[list[int], int]"),
      nb::arg("tokens"), nb::arg("extra_key").none() = 0, nb::arg("max_tokens").none() = nb::none(),
      "Token-granular match: (block_ids, num_cached_tokens). Full blocks as "
      "match_prefix; when "
      "the match ends inside a block, the last id is a fresh block whose first "
      "num_cached_tokens % block_size slots get copied from a cached block "
      "(the copy is in "
      "take_pending_copies()).");
  cls.def(
      "cache_full_block",
      [](BlockAllocator& a, nb::handle id_arg, nb::handle parent, nb::handle tokens,
         nb::handle extra_key_arg) {
        const int64_t id = int_arg<int64_t>(id_arg, "id");
        auto v = to_ids(std::vector<int64_t>{id}, a.num_blocks(), "id");
        const uint64_t extra_key = to_key(extra_key_arg, "extra_key");
        TokenSpan t = to_tokens(tokens, "tokens");
        PAGEDKV_CHECK(t.size == static_cast<size_t>(a.block_size()),
                      "tokens must hold block_size (", a.block_size(), ") ids, got ", t.size);
        // A negative id is no token: caching it would make a prefix no prompt can match.
        for (size_t i = 0; i < t.size; ++i)
          PAGEDKV_CHECK(t.data[i] >= 0, "tokens must be non-negative token ids, got ", t.data[i],
                        " at index ", i);
        BlockHash h;
        Status s = a.try_cache_full_block(v[0], to_parent(parent), t.data, extra_key, &h);
        if (s == Status::kInvalidArgument)
          throw ValueError(
              detail::concat("id: block ", id, " is already cached with other content"));
        if (s != Status::kOk) raise(s, "id", v, [&](BlockId i) { return a.ref_count(i); });
        return to_tuple(h);
      },
      nb::sig("def cache_full_block(self, id: int, parent: tuple[int, int] | None, "
              "tokens: " PAGEDKV_TOKENS_T ", extra_key: int = 0) -> tuple[int, int]"),
      nb::arg("id").none(), nb::arg("parent").none(), nb::arg("tokens"),
      nb::arg("extra_key").none() = 0,
      "Registers full block `id` (its tokens, child of `parent`; None = root) "
      "in the prefix "
      "cache and returns its hash. A duplicate of cached content stays "
      "uncached.");
  cls.def(
      "block_hash",
      [](const BlockAllocator& a, nb::handle id) -> std::optional<HashTuple> {
        auto v = to_id(id, a.num_blocks(), "id");
        BlockHash h;
        if (!a.cached_hash(v[0], &h)) return std::nullopt;
        return to_tuple(h);
      },
      nb::sig("def block_hash(self, id: int) -> tuple[int, int] | None"), nb::arg("id").none(),
      "The cached hash of `id`, or None when it holds none.");
  cls.def("reset_prefix_cache", &BlockAllocator::reset_prefix_cache,
          "Drops every cached hash; blocks in use are unaffected.");
  cls.def("stats", &stats, "Gauges and counters for metrics, as a dict of ints.");
  cls.def("check_invariants", &BlockAllocator::check_invariants,
          "Full O(num_blocks) consistency check: '' when consistent, else the "
          "first problems.");
  cls.def("__repr__", [](const BlockAllocator& a) {
    return detail::concat("BlockAllocator(num_blocks=", a.num_blocks(),
                          ", block_size=", a.block_size(), ", num_cpu_blocks=", a.num_cpu_blocks(),
                          ", used=", a.num_used_blocks(), ", cached=", a.num_cached_blocks(), ")");
  });
}

}  // namespace pagedkv::python
