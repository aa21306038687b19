// sample_exponential_race on the CPU: one sweep per row, rows over the thread pool.
#include <cstdint>

#include "ops/cpu/parallel.h"
#include "ops/cpu/sampling_ops.h"
#include "ops/race_noise.h"

namespace pagedkv::cpu_ops {

void sample_exponential_race(const TensorView& tokens, const TensorView& probs,
                             const TensorView& thresholds, const TensorView& keys) {
  const int64_t rows = probs.size(0), n = probs.size(1);
  parallel_for(
      rows,
      [&](int64_t b) {
        const float* p = probs.data_as<const float>() + b * probs.stride(0);
        const float thr = thresholds.data_as<const float>()[b * thresholds.stride(0)];
        const auto key = static_cast<uint64_t>(keys.data_as<const int64_t>()[b * keys.stride(0)]);
        int64_t best = -1;
        float best_score = -1.0f;
        for (int64_t v = 0; v < n; ++v) {
          if (!(p[v] >= thr)) continue;
          const float score = p[v] / ops::race::exponential(key, static_cast<uint64_t>(v));
          if (score > best_score) {
            best_score = score;
            best = v;
          }
        }
        tokens.data_as<int64_t>()[b * tokens.stride(0)] = best < 0 ? 0 : best;
      },
      rows * n * 20);
}

}  // namespace pagedkv::cpu_ops
