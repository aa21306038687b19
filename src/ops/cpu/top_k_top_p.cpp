// top_k_top_p_threshold on the CPU: per row, the radix search of threshold_search.h over the
// row's values (each pass one sweep building a 256-bin histogram), rows over the thread pool.
#include <algorithm>
#include <cstdint>

#include "ops/cpu/attention_common.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/sampling_ops.h"
#include "ops/threshold_search.h"

namespace pagedkv::cpu_ops {
namespace {

namespace th = ops::threshold;

struct Row {
  const float* p;
  int64_t n;
};

// The k-th largest key of the row.
uint32_t kth_key(const Row& r, int64_t k) {
  th::Search s;
  int64_t remaining = k;
  for (int pass = 0; pass < th::kPasses; ++pass) {
    uint32_t count[th::kBins] = {};
    for (int64_t i = 0; i < r.n; ++i) {
      const uint32_t key = th::key_of(r.p[i]);
      if (s.in_range(key)) ++count[s.bin(key)];
    }
    s.descend(th::pick_kth(count, remaining));
  }
  return s.prefix;
}

// The smallest key >= floor whose strictly-greater mass is < target (or the largest key).
uint32_t top_p_key(const Row& r, uint64_t target, uint32_t floor) {
  th::Search s;
  s.floor = floor;
  uint64_t above = 0;
  for (int pass = 0; pass < th::kPasses; ++pass) {
    uint32_t count[th::kBins] = {};
    uint64_t mass[th::kBins] = {};
    for (int64_t i = 0; i < r.n; ++i) {
      const uint32_t key = th::key_of(r.p[i]);
      if (!s.in_range(key)) continue;
      ++count[s.bin(key)];
      mass[s.bin(key)] += th::mass_of(r.p[i]);
    }
    s.descend(th::pick_top_p(count, mass, above, target));
  }
  return s.prefix;
}

float row_threshold(const Row& r, int64_t k, float top_p, float min_p) {
  const bool use_k = k > 0 && k < r.n;
  const uint32_t k_key = use_k ? kth_key(r, k) : 0;
  float threshold = use_k ? th::value_of(k_key) : 0.0f;
  if (top_p < 1.0f) {
    uint64_t kept = 0;  // mass of the top-k set
    for (int64_t i = 0; i < r.n; ++i)
      if (th::key_of(r.p[i]) >= k_key) kept += th::mass_of(r.p[i]);
    const uint64_t target = th::top_p_target(top_p, kept);
    threshold = std::max(threshold, th::value_of(top_p_key(r, target, k_key)));
  }
  if (min_p > 0.0f) {
    float top = 0.0f;
    for (int64_t i = 0; i < r.n; ++i) top = std::max(top, r.p[i]);
    threshold = std::max(threshold, min_p * top);
  }
  return threshold;
}

}  // namespace

void top_k_top_p_threshold(const TensorView& thresholds, const TensorView& probs,
                           const TensorView& top_k, const TensorView& top_p,
                           const TensorView& min_p) {
  const int64_t rows = probs.size(0), n = probs.size(1);
  const IntArray k(top_k);
  const float* p_base = probs.data_as<const float>();
  float* out = thresholds.data_as<float>();
  parallel_for(
      rows,
      [&](int64_t b) {
        const Row r{p_base + b * probs.stride(0), n};
        const float tp = top_p.data_as<const float>()[b * top_p.stride(0)];
        const float mp = min_p.data_as<const float>()[b * min_p.stride(0)];
        out[b * thresholds.stride(0)] = row_threshold(r, k[b], tp, mp);
      },
      rows * n * 10);
}

}  // namespace pagedkv::cpu_ops
