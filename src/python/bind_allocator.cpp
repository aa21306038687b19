// Python bindings of pagedkv::BlockAllocator (block pool, prefix cache, host swap pool).
//
// Conventions: block ids are Python ints; a block hash is a 2-tuple of ints (lo, hi) holding the
// two 64-bit halves, (0, 0) being the root (parent of a sequence's first block); copy and swap
// mappings are [n, 2] int64 numpy arrays, the format ops.copy_blocks / ops.swap_blocks take. Non-OK
// statuses become ValueError naming the argument (MemoryError when out of blocks). The GIL is kept:
// every call is micro-seconds of work and the allocator is not thread-safe, so releasing it would
// need a lock that costs more than it could save.
#include "python/allocator_util.h"

namespace pagedkv::python {

void bind_allocator(nb::module_& m) {
  m.attr("ROOT_BLOCK_HASH") = to_tuple(kRootHash);
  // Registered twice (module function and BlockAllocator.hash_block) with def / def_static: a
  // staticmethod wrapper built by hand would need PyStaticMethod_New, outside the stable ABI.
  auto hash_fn = [](nb::handle parent, nb::handle tokens, nb::handle extra_key) {
    TokenSpan t = to_tokens(tokens, "tokens");
    return to_tuple(hash_block(to_parent(parent), t.data, t.size, to_key(extra_key, "extra_key")));
  };
  constexpr const char* kHashSig =
      "def hash_block(parent: tuple[int, int] | None, tokens: " PAGEDKV_TOKENS_T
      ", extra_key: int = 0) -> tuple[int, int]";
  constexpr const char* kHashDoc =
      "128-bit chained hash H(parent, tokens, extra_key) as (lo, hi); parent None = root.";
  m.def("hash_block", hash_fn, nb::sig(kHashSig), nb::arg("parent").none(), nb::arg("tokens"),
        nb::arg("extra_key").none() = 0, kHashDoc);

  nb::class_<BlockAllocator> cls(m, "BlockAllocator",
                                 "KV-cache block pool: ref counts, copy-on-write, host swap pool "
                                 "and automatic prefix caching.");
  cls.def_static("hash_block", hash_fn, nb::sig(kHashSig), nb::arg("parent").none(),
                 nb::arg("tokens"), nb::arg("extra_key").none() = 0, kHashDoc);
  cls.attr("ROOT_HASH") = m.attr("ROOT_BLOCK_HASH");
  cls.def(
      "__init__",
      [](BlockAllocator* self, nb::handle num_blocks_arg, nb::handle block_size_arg,
         nb::handle num_cpu_blocks_arg, bool enable_prefix_caching) {
        const int64_t num_blocks = int_arg<int64_t>(num_blocks_arg, "num_blocks");
        const int64_t block_size = int_arg<int64_t>(block_size_arg, "block_size");
        const int64_t num_cpu_blocks = int_arg<int64_t>(num_cpu_blocks_arg, "num_cpu_blocks");
        check_count(num_blocks, "num_blocks");
        check_count(num_cpu_blocks, "num_cpu_blocks");
        PAGEDKV_CHECK(block_size >= 1 && block_size <= INT32_MAX, "block_size must be >= 1, got ",
                      block_size);
        BlockAllocatorConfig c;
        c.num_blocks = static_cast<int32_t>(num_blocks);
        c.block_size = static_cast<int32_t>(block_size);
        c.num_cpu_blocks = static_cast<int32_t>(num_cpu_blocks);
        c.enable_prefix_caching = enable_prefix_caching;
        new (self) BlockAllocator(c);
      },
      nb::sig("def __init__(self, num_blocks: int, block_size: int, num_cpu_blocks: int = 0, "
              "enable_prefix_caching: bool = True) -> None"),
      nb::arg("num_blocks").none(), nb::arg("block_size").none(),
      nb::arg("num_cpu_blocks").none() = 0, nb::arg("enable_prefix_caching") = true);

  cls.def_prop_ro("num_blocks", &BlockAllocator::num_blocks)
      .def_prop_ro("block_size", &BlockAllocator::block_size)
      .def_prop_ro("num_cpu_blocks", &BlockAllocator::num_cpu_blocks)
      .def_prop_ro("enable_prefix_caching", &BlockAllocator::enable_prefix_caching)
      .def_prop_ro("num_free_blocks", &BlockAllocator::num_free_blocks,
                   "Blocks allocate() can hand out (includes evictable cached ones).")
      .def_prop_ro("num_used_blocks", &BlockAllocator::num_used_blocks, "Blocks with ref > 0.")
      .def_prop_ro("num_cached_blocks", &BlockAllocator::num_cached_blocks,
                   "Blocks registered in the prefix cache (in use or free).")
      .def_prop_ro("num_cached_free_blocks", &BlockAllocator::num_cached_free_blocks,
                   "Free blocks that still hold a cached prefix.")
      .def_prop_ro("num_free_cpu_blocks", &BlockAllocator::num_free_cpu_blocks)
      .def_prop_ro(
          "usage",
          [](const BlockAllocator& a) {
            return a.num_blocks() ? double(a.num_used_blocks()) / a.num_blocks() : 0.0;
          },
          "Fraction of blocks in use (kv_cache_usage_perc).");

  cls.def(
      "allocate",
      [](BlockAllocator& a, nb::handle n_arg) {
        const int64_t n = int_arg<int64_t>(n_arg, "n");
        PAGEDKV_CHECK(n >= 0, "n must be >= 0, got ", n);
        std::vector<BlockId> out;
        // n beyond int32 can never be satisfied: the same MemoryError as any n > free.
        Status s = n > a.num_free_blocks() ? Status::kOutOfBlocks
                                           : a.allocate(static_cast<int32_t>(n), &out);
        if (s != Status::kOk) {
          std::string msg = detail::concat("allocate: ", n, " blocks requested, only ",
                                           a.num_free_blocks(), " free");
          PyErr_SetString(PyExc_MemoryError, msg.c_str());
          throw nb::python_error();
        }
        return out;
      },
      nb::sig("def allocate(self, n: int) -> list[int]"), nb::arg("n").none(),
      "n fresh blocks (ref 1); MemoryError (nothing allocated) if fewer are "
      "free.");
  cls.def(
      "free",
      [](BlockAllocator& a, nb::handle ids) {
        auto v = to_ids(ids, a.num_blocks(), "ids");
        Status s = a.free(v.data(), v.size());
        if (s != Status::kOk) raise(s, "ids", v, [&](BlockId i) { return a.ref_count(i); });
      },
      nb::sig("def free(self, ids: collections.abc.Sequence[int]) -> None"), nb::arg("ids").none(),
      "Drops one reference per id (a sequence's blocks in order; freed tail "
      "first).");
  cls.def(
      "fork",
      [](BlockAllocator& a, nb::handle ids) {
        auto v = to_ids(ids, a.num_blocks(), "ids");
        Status s = a.fork(v.data(), v.size());
        if (s != Status::kOk)
          raise(s, "ids", v, [&](BlockId i) { return a.ref_count(i) > 0 ? INT32_MAX : 0; });
      },
      nb::sig("def fork(self, ids: collections.abc.Sequence[int]) -> None"), nb::arg("ids").none(),
      "Adds one reference per id (all must be allocated).");
  cls.def(
      "ref_count",
      [](const BlockAllocator& a, nb::handle id) {
        return a.ref_count(to_id(id, a.num_blocks(), "id")[0]);
      },
      nb::sig("def ref_count(self, id: int) -> int"), nb::arg("id").none());
  cls.def(
      "copy_on_write",
      [](BlockAllocator& a, nb::handle id) {
        auto v = to_id(id, a.num_blocks(), "id");
        bool copied = false;
        Status s = a.copy_on_write(&v[0], &copied);
        if (s != Status::kOk) raise(s, "id", v, [&](BlockId i) { return a.ref_count(i); });
        return std::make_pair(static_cast<int64_t>(v[0]), copied);
      },
      nb::sig("def copy_on_write(self, id: int) -> tuple[int, bool]"), nb::arg("id").none(),
      "Before writing into `id`: (new_id, True) with the copy recorded if it "
      "is shared or "
      "cached, else (id, False).");
  cls.def(
      "take_pending_copies", [](BlockAllocator& a) { return to_numpy(a.take_pending_copies()); },
      "Recorded (src, dst) block copies as an [n, 2] int64 array (clears the "
      "list).");

  cls.def(
      "swap_out",
      [](BlockAllocator& a, nb::handle ids) {
        auto v = to_ids(ids, a.num_blocks(), "ids");
        std::vector<BlockId> cpu;
        Pairs map;
        Status s = a.swap_out(v.data(), v.size(), &cpu, &map);
        if (s != Status::kOk) raise(s, "ids", v, [&](BlockId i) { return a.ref_count(i); });
        return std::make_pair(cpu, to_numpy(map));
      },
      nb::sig("def swap_out(self, ids: collections.abc.Sequence[int]) -> tuple[list[int], "
              "numpy.typing.NDArray[numpy.int64]]"),
      nb::arg("ids").none(),
      "Moves blocks to the host pool: (cpu_ids, [n, 2] (device, host) "
      "mapping).");
  cls.def(
      "swap_in",
      [](BlockAllocator& a, nb::handle cpu_ids) {
        auto v = to_ids(cpu_ids, a.num_cpu_blocks(), "cpu_ids");
        std::vector<BlockId> dev;
        Pairs map;
        Status s = a.swap_in(v.data(), v.size(), &dev, &map);
        if (s != Status::kOk) raise(s, "cpu_ids", v, [&](BlockId i) { return a.cpu_ref_count(i); });
        return std::make_pair(dev, to_numpy(map));
      },
      nb::sig("def swap_in(self, cpu_ids: collections.abc.Sequence[int]) -> tuple[list[int], "
              "numpy.typing.NDArray[numpy.int64]]"),
      nb::arg("cpu_ids").none(), "Moves blocks back: (ids, [n, 2] (host, device) mapping).");
  cls.def(
      "free_cpu",
      [](BlockAllocator& a, nb::handle cpu_ids) {
        auto v = to_ids(cpu_ids, a.num_cpu_blocks(), "cpu_ids");
        Status s = a.free_cpu(v.data(), v.size());
        if (s != Status::kOk) raise(s, "cpu_ids", v, [&](BlockId i) { return a.cpu_ref_count(i); });
      },
      nb::sig("def free_cpu(self, cpu_ids: collections.abc.Sequence[int]) -> None"),
      nb::arg("cpu_ids").none(), "Releases host blocks (e.g. a swapped-out sequence was aborted).");
  cls.def(
      "cpu_ref_count",
      [](const BlockAllocator& a, nb::handle id) {
        return a.cpu_ref_count(to_id(id, a.num_cpu_blocks(), "id")[0]);
      },
      nb::sig("def cpu_ref_count(self, id: int) -> int"), nb::arg("id").none());

  bind_prefix_cache(cls);
}

}  // namespace pagedkv::python
