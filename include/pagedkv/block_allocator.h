// BlockAllocator: the KV-cache memory manager. Hands out fixed-size blocks of the paged cache,
// counts references so sequences can share blocks (fork, copy-on-write), keeps a host (CPU)
// pool for swapping, and caches full blocks by content hash for automatic prefix reuse.
//
// Hot-path calls return a Status instead of throwing (no exceptions across the hot path); only
// the constructor and the legacy cache_full_block overload throw pagedkv::ValueError.
// Not thread-safe: one owner (the scheduler) drives it.
//
// Memory model (vLLM v1 style): every block with ref count 0 sits in one intrusive free queue.
// Uncached free blocks go to its head (reused first); cached ones go to its tail and keep their
// hash until popped for reuse (lazy eviction, least recently freed first).
//
// Ordering: a step's block moves run before its KV writes, in the StepPlan's order: swap-outs,
// swap-ins, then copies. Safe because a copy's source is either still referenced by another
// sequence or kept referenced until take_pending_copies() (so a swap-in cannot take it), and
// blocks freed by swap-outs are only read before anything is written into them. Do not swap a
// sequence in and another out in the same step (a host block freed by the swap-in could be the
// swap-out's destination).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
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
// Throws pagedkv::ValueError when `tokens` is null and num_tokens > 0.
BlockHash hash_block(const BlockHash& parent, const int32_t* tokens, size_t num_tokens,
                     uint64_t extra_key = 0);

struct BlockAllocatorConfig {
  int32_t num_blocks = 0;      // device (GPU or CPU-cache) blocks
  int32_t block_size = 16;     // tokens per block
  int32_t num_cpu_blocks = 0;  // host swap pool size (0 = no swapping)
  bool enable_prefix_caching = true;
};

struct AllocatorCounters {
  int64_t prefix_queries_tokens = 0;  // tokens looked up in the prefix cache
  int64_t prefix_hits_tokens = 0;     // tokens found
  int64_t evictions = 0;              // cached blocks reused for new content
  int64_t prefix_queries = 0;         // match_prefix* calls (prefix caching enabled)
  int64_t prefix_hit_queries = 0;     // calls that matched at least one token
  int64_t partial_hit_tokens = 0;     // tokens reused from partially matched blocks (in hits)
  int64_t cow_copies = 0;             // block copies recorded (copy-on-write + partial reuse)
  int64_t hash_collisions = 0;        // hash hits whose tokens/parent/extra key differed
  int64_t swapped_out_blocks = 0;
  int64_t swapped_in_blocks = 0;
};

class BlockAllocator {
 public:
  // Throws pagedkv::ValueError for num_blocks < 0, block_size < 1 or num_cpu_blocks < 0.
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
  // Blocks registered in the prefix cache (in use or free).
  int32_t num_cached_blocks() const;
  bool enable_prefix_caching() const;

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
  // A private (ref 1) uncached block is returned unchanged. Errors: kInvalidBlock,
  // kNotAllocated, kOutOfBlocks (nothing changed). When the dropped reference is the source's
  // last one (a private cached block), the source stays referenced until
  // take_pending_copies(), so nothing else can take and overwrite it before the copy runs.
  Status copy_on_write(BlockId* id, bool* copied);
  // (src, dst) pairs recorded since the last call, for ops.copy_blocks. Clears the list and
  // releases the sources kept alive for the copies (see copy_on_write, match_prefix_tokens):
  // call it when the step's allocations are done (the scheduler: when it builds the plan).
  std::vector<std::pair<int64_t, int64_t>> take_pending_copies();

  // ---- prefix caching -------------------------------------------------------------------
  // Longest cached run of full blocks for `tokens` (at most max_blocks blocks); each matched
  // block gets one reference (it leaves the free queue if it was there) and is appended to
  // *out, with its hash appended to *hashes. Returns the number of matched blocks. Counts
  // one query of num_tokens and the hit tokens. max_blocks < 0 means no cap; only full blocks
  // of `tokens` are considered. Each hit is verified against the block's stored tokens, extra
  // key and parent hash, so a hash collision can only cost a miss, never a wrong block.
  int32_t match_prefix(const int32_t* tokens, size_t num_tokens, uint64_t extra_key,
                       int32_t max_blocks, std::vector<BlockId>* out,
                       std::vector<BlockHash>* hashes);
  // Registers `id` (now full with `tokens`, child of `parent`) in the cache so later prompts can
  // reuse it; returns its hash. A block whose hash is already cached by another block stays
  // uncached (duplicates are tolerated so block tables stay append-only). `tokens` holds
  // block_size ids. Throws pagedkv::ValueError for a bad or free id (see try_cache_full_block).
  // With prefix caching off it only computes the hash.
  BlockHash cache_full_block(BlockId id, const BlockHash& parent, const int32_t* tokens,
                             uint64_t extra_key = 0);
  // Drops every cached hash (e.g. after weights change). Blocks in use are unaffected.
  void reset_prefix_cache();

  // Same as cache_full_block without exceptions: kInvalidBlock / kNotAllocated for a bad id,
  // kInvalidArgument when `id` is already cached with a different hash. *out gets the hash.
  Status try_cache_full_block(BlockId id, const BlockHash& parent, const int32_t* tokens,
                              uint64_t extra_key, BlockHash* out);
  // Like match_prefix but takes no references and counts nothing: how many full blocks a
  // match_prefix with the same arguments would return now.
  int32_t peek_prefix(const int32_t* tokens, size_t num_tokens, uint64_t extra_key,
                      int32_t max_blocks) const;
  // Token-granular variant (block_size > 1): matches full blocks like match_prefix (at most
  // max_tokens / block_size of them), then, when the match ends inside a block, looks for a
  // cached child of the last matched block whose first k tokens equal the next prompt tokens
  // (1 <= k < block_size, within max_tokens). If one exists, a fresh block (ref 1) is allocated,
  // the copy (cached block -> fresh block) is recorded in take_pending_copies(), and the fresh
  // block is appended to *out: its first k slots are valid, the sequence appends from slot k.
  // The cached source keeps a reference until take_pending_copies().
  // Returns the number of cached tokens (full blocks * block_size + k); max_tokens < 0 = no
  // cap. Hashes are appended for the full blocks only. Never fails: without a free block it
  // skips the partial block.
  int32_t match_prefix_tokens(const int32_t* tokens, size_t num_tokens, uint64_t extra_key,
                              int32_t max_tokens, std::vector<BlockId>* out,
                              std::vector<BlockHash>* hashes);
  // Cached hash of `id`; false when it holds none (or prefix caching is off).
  bool cached_hash(BlockId id, BlockHash* out) const;

  // ---- host swap pool -----------------------------------------------------------------
  int32_t num_cpu_blocks() const;
  int32_t num_free_cpu_blocks() const;
  // Moves blocks to host: allocates one host block per device block, frees the device blocks,
  // appends host ids to *cpu_ids and (device, host) pairs to *mapping. All or nothing.
  // A shared device block only loses this sequence's reference (its host copy is private).
  Status swap_out(const BlockId* ids, size_t n, std::vector<BlockId>* cpu_ids,
                  std::vector<std::pair<int64_t, int64_t>>* mapping);
  // Reverse: allocates device blocks for host blocks, frees the host blocks, appends device ids
  // to *ids and (host, device) pairs to *mapping. All or nothing.
  Status swap_in(const BlockId* cpu_ids, size_t n, std::vector<BlockId>* ids,
                 std::vector<std::pair<int64_t, int64_t>>* mapping);

  // Drops one reference from host blocks (a swapped-out sequence that is aborted).
  Status free_cpu(const BlockId* cpu_ids, size_t n);
  // Ref count of host block `id` (0 when free); -1 if out of range.
  int32_t cpu_ref_count(BlockId id) const;

  const AllocatorCounters& counters() const;
  // Full consistency check of the internal structures, O(num_blocks) (tests, debugging).
  // Returns an empty string when consistent, else a description of the first problems.
  std::string check_invariants() const;

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace pagedkv
