// The radix search of top_k_top_p_threshold (include/pagedkv/sampling_ops.h), shared by the CPU
// and CUDA kernels: both build the same 256-bin histograms of a row's values and pick bins with
// these functions, so they return identical thresholds.
//
// A probability in [0, 1] is searched as its float32 bit pattern (for non-negative floats the
// order of the bits is the order of the values), 8 bits a pass from the top. Masses are 2^-32
// fixed point in uint64: exact sums in any order.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define PAGEDKV_HD __host__ __device__ __forceinline__
#else
#define PAGEDKV_HD inline
#endif

namespace pagedkv::ops::threshold {

inline constexpr int kBins = 256;
inline constexpr int kPasses = 4;  // 32 bits, 8 a pass

// The search key of a probability: its bits (0 for zeros and anything not > 0).
PAGEDKV_HD uint32_t key_of(float p) {
  uint32_t u = 0;
  if (p > 0.0f) memcpy(&u, &p, sizeof u);
  return u;
}

PAGEDKV_HD float value_of(uint32_t key) {
  float f;
  memcpy(&f, &key, sizeof f);
  return f;
}

// 2^-32 fixed point of a probability in [0, 1].
PAGEDKV_HD uint64_t mass_of(float p) {
  return p > 0.0f ? static_cast<uint64_t>(static_cast<double>(p) * 4294967296.0) : 0;
}

// The state of one search: keys >= floor whose bits above `shift + 8` equal `prefix` are still
// in. (Top-p searches above the top-k threshold only: the result is their maximum anyway, and
// below it nothing changes the mass above a key that is above it.)
struct Search {
  uint32_t prefix = 0;
  uint32_t floor = 0;
  int shift = 24;  // the pass's bin is (key >> shift) & 255
  PAGEDKV_HD bool in_range(uint32_t key) const {
    return key >= floor && (shift == 24 || (key >> (shift + 8)) == (prefix >> (shift + 8)));
  }
  PAGEDKV_HD int bin(uint32_t key) const { return static_cast<int>((key >> shift) & 255u); }
  PAGEDKV_HD void descend(int b) {
    prefix |= static_cast<uint32_t>(b) << shift;
    shift -= 8;
  }
};

// k-th largest: picks the bin holding the `remaining`-th largest key of the range (counted from
// the top) and updates `remaining` to its rank inside that bin.
PAGEDKV_HD int pick_kth(const uint32_t* count, int64_t& remaining) {
  for (int b = kBins - 1; b > 0; --b) {
    if (count[b] >= remaining) return b;
    remaining -= count[b];
  }
  return 0;
}

// Top-p keeps a token when the mass strictly above it is < target = ceil(top_p * kept mass)
// (fixed point), and always the most probable token.
PAGEDKV_HD uint64_t top_p_target(float top_p, uint64_t kept) {
  return static_cast<uint64_t>(ceil(static_cast<double>(top_p) * static_cast<double>(kept)));
}

// Top-p: the lowest non-empty bin whose keys have mass above them (`above` plus the bins over
// it) < target; `above` becomes that bin's. The first non-empty bin always qualifies (its top
// key is either the row's maximum or was chosen for above < target), so the answer is in the
// returned bin.
PAGEDKV_HD int pick_top_p(const uint32_t* count, const uint64_t* mass, uint64_t& above,
                          uint64_t target) {
  int best = -1;
  uint64_t best_above = above, run = above;
  for (int b = kBins - 1; b >= 0; --b) {
    if (count[b] == 0) continue;
    if (best >= 0 && run >= target) break;
    best = b;
    best_above = run;
    run += mass[b];
  }
  above = best_above;
  return best < 0 ? 0 : best;
}

}  // namespace pagedkv::ops::threshold
