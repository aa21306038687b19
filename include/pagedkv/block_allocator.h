// BlockAllocator: the KV-cache memory manager. Hands out fixed-size blocks of the paged cache,
// counts references so sequences can share blocks (fork, copy-on-write), keeps a host (CPU)
// pool for swapping, and caches full blocks by content hash for automatic prefix reuse.
//
// API CONTRACT DRAFT (lead): the scheduler is written against these signatures. The allocator
// implementation may add members; changing these needs the scheduler to follow.
//
// Hot-path calls return a Status instead of throwing (no exceptions across the hot path).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace pagedkv {

using BlockId = int32_t;
inline constexpr BlockId kNoBlock = -1;

enum class Status : uint8_t {
  kOk = 0,
  kOutOfBlocks,   // fewer free blocks than requested (nothing was allocated)
  kInvalidBlock,  // id out of range
  kNotAllocated,  // free/fork/ref of a block whose ref count is 0 (e.g. double free)
  kInvalidArgument,
};
const char* status_message(Status s);

// 128-bit content hash of a full block chained over its parent: H(parent, tokens, extra_key).
struct BlockHash {
  uint64_t lo = 0, hi = 0;
  bool operator==(const BlockHash& o) const { return lo == o.lo && hi == o.hi; }
  bool operator!=(const BlockHash& o) const { return !(*this == o); }
};
inline constexpr BlockHash kRootHash{};  // parent of a sequence's first block

// Hash of a full block of `block_size` tokens whose predecessor block has hash `parent`.
// `extra_key` distinguishes otherwise identical prefixes (LoRA adapter id, cache salt); 0 = none.
BlockHash hash_block(const BlockHash& parent, const int32_t* tokens, size_t num_tokens,
                     uint64_t extra_key = 0);

struct BlockAllocatorConfig {
  int32_t num_blocks = 0;       // device (GPU or CPU-cache) blocks
  int32_t block_size = 16;      // tokens per block
  int32_t num_cpu_blocks = 0;   // host swap pool size (0 = no swapping)
  bool enable_prefix_caching = true;
};

struct AllocatorCounters {
  int64_t prefix_queries_tokens = 0;  // tokens looked up in the prefix cache
  int64_t prefix_hits_tokens = 0;     // tokens found
  int64_t evictions = 0;              // cached blocks reused for new content
};

class BlockAllocator {
 public:
  explicit BlockAllocator(const BlockAllocatorConfig& config);
  ~BlockAllocator();
  BlockAllocator(const BlockAllocator&) = delete;
  BlockAllocator& operator=(const BlockAllocator&) = delete;

  int32_t num_blocks() const;
  int32_t block_size() const;
  // Blocks that an allocate() can hand out now: never-used + freed + evictable cached ones.
  int32_t num_free_blocks() const;
  // Blocks with ref count 0 that still hold a cached prefix (a subset of the free ones).
  int32_t num_cached_free_blocks() const;
  // Blocks with ref count > 0.
  int32_t num_used_blocks() const;

  // All-or-nothing: appends n fresh blocks (ref count 1) to *out, or returns kOutOfBlocks.
  // A cached block popped for reuse loses its hash (lazy eviction, least recently freed first).
  Status allocate(int32_t n, std::vector<BlockId>* out);
  // Drops one reference from each id. Pass a sequence's blocks in order: they are released
  // tail-first so that the tails of cached chains are evicted before their heads.
  Status free(const BlockId* ids, size_t n);
  // Adds one reference to each id (sharing between sequences, n > 1 sampling).
  Status fork(const BlockId* ids, size_t n);
  // Ref count of `id` (0 when free); -1 if `id` is out of range.
  int32_t ref_count(BlockId id) const;

  // Copy-on-write before appending into `*id`: if it is shared (ref > 1) or cached-and-full
  // content must not change, allocates a fresh block, drops one ref of the old one, records the
  // (src, dst) pair for copy_blocks and updates *id. *copied tells whether that happened.
  Status copy_on_write(BlockId* id, bool* copied);
  // (src, dst) pairs recorded since the last call, for ops.copy_blocks. Clears the list.
  std::vector<std::pair<int64_t, int64_t>> take_pending_copies();

  // ---- prefix caching -------------------------------------------------------------------
  // Longest cached run of full blocks for `tokens` (at most max_blocks blocks); each matched
  // block gets one reference (it leaves the free queue if it was there) and is appended to
  // *out, with its hash appended to *hashes. Returns the number of matched blocks. Counts
  // one query of num_tokens and the hit tokens.
  int32_t match_prefix(const int32_t* tokens, size_t num_tokens, uint64_t extra_key,
                       int32_t max_blocks, std::vector<BlockId>* out,
                       std::vector<BlockHash>* hashes);
  // Registers `id` (now full with `tokens`, child of `parent`) in the cache so later prompts can
  // reuse it; returns its hash. A block whose hash is already cached by another block stays
  // uncached (duplicates are tolerated so block tables stay append-only).
  BlockHash cache_full_block(BlockId id, const BlockHash& parent, const int32_t* tokens,
                             uint64_t extra_key = 0);
  // Drops every cached hash (e.g. after weights change). Blocks in use are unaffected.
  void reset_prefix_cache();

  // ---- host swap pool -----------------------------------------------------------------
  int32_t num_cpu_blocks() const;
  int32_t num_free_cpu_blocks() const;
  // Moves blocks to host: allocates one host block per device block, frees the device blocks,
  // appends host ids to *cpu_ids and (device, host) pairs to *mapping. All or nothing.
  Status swap_out(const BlockId* ids, size_t n, std::vector<BlockId>* cpu_ids,
                  std::vector<std::pair<int64_t, int64_t>>* mapping);
  // Reverse: allocates device blocks for host blocks, frees the host blocks, appends device ids
  // to *ids and (host, device) pairs to *mapping. All or nothing.
  Status swap_in(const BlockId* cpu_ids, size_t n, std::vector<BlockId>* ids,
                 std::vector<std::pair<int64_t, int64_t>>* mapping);

  const AllocatorCounters& counters() const;

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace pagedkv
