// The 128-bit chained block hash H(parent, tokens, extra_key).
//
// Why 128 bits, and why we still compare tokens: with a well-mixed 128-bit hash the chance that any
// two of n distinct blocks collide is about n^2 / 2^129; even n = 2^40 cached blocks over a
// server's lifetime gives ~2^-49. On top of that the allocator stores each cached block's tokens,
// extra key and parent hash and compares them on every hit, so a collision between two blocks can
// only turn a hit into a miss; a wrong block would need two *different* parent chains whose 128-bit
// hashes collide and then identical block tokens — the birthday bound above. This is not a
// cryptographic hash: tenants that must not probe each other's cache use distinct extra keys.
//
// Construction: two 64-bit lanes with different constants absorb the tokens two at a time. Each
// absorb step is a bijection of the lane for a fixed word and injective in the word for a fixed
// lane (xor, multiply by an odd constant, rotate), so two inputs of the same length that differ in
// a single word never collide in a lane; a two-round Feistel of strong 64-bit finalizers then mixes
// the lanes into each other (also a bijection, so no entropy is lost at the end).
#include <cstring>

#include "pagedkv/block_allocator.h"
#include "pagedkv/error.h"

namespace pagedkv {
namespace {

constexpr uint64_t kK1 = 0x9E3779B97F4A7C15ULL;
constexpr uint64_t kK2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kK3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kK4 = 0xD6E8FEB86659FD93ULL;
constexpr uint64_t kK5 = 0x27D4EB2F165667C5ULL;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// splitmix64 / murmur3-style finalizer: full avalanche of a 64-bit word.
inline uint64_t fmix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  x ^= x >> 31;
  return x;
}

inline void absorb(uint64_t w, uint64_t* a, uint64_t* b) {
  *a = rotl(*a ^ (w * kK1), 31) * kK2;
  *b = rotl(*b ^ (w * kK3), 29) * kK4;
}

}  // namespace

BlockHash hash_block(const BlockHash& parent, const int32_t* tokens, size_t num_tokens,
                     uint64_t extra_key) {
  PAGEDKV_CHECK(tokens != nullptr || num_tokens == 0,
                "hash_block: tokens is null but num_tokens = ", num_tokens);
  // The parent, the extra key and the length seed the lanes (all three are part of the key).
  uint64_t a = fmix(parent.lo ^ kK1) ^ fmix(extra_key + kK5);
  uint64_t b = fmix(parent.hi ^ kK2) ^ fmix(static_cast<uint64_t>(num_tokens) * kK3 + kK4);
  size_t i = 0;
  for (; i + 1 < num_tokens; i += 2) {
    uint64_t w = static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) |
                 (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i + 1])) << 32);
    absorb(w, &a, &b);
  }
  if (i < num_tokens) absorb(static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])), &a, &b);
  a ^= fmix(b + kK5);
  b ^= fmix(a + kK1);
  a ^= fmix(b + kK3);
  return BlockHash{a, b};
}

}  // namespace pagedkv
