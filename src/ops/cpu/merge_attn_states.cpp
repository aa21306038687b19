// merge_attn_states on the CPU: one (token, head) row at a time, in fp32.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/attention_common.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/parallel.h"

namespace pagedkv::cpu_ops {

void merge_attn_states(const TensorView& output, const std::optional<TensorView>& output_lse,
                       const TensorView& prefix_output, const TensorView& prefix_lse,
                       const TensorView& suffix_output, const TensorView& suffix_lse) {
  const RowArray out(output), pre(prefix_output), suf(suffix_output);
  const int64_t T = output.size(0), H = output.size(1);
  const int D = static_cast<int>(output.size(2));
  const float* lp_all = prefix_lse.data_as<const float>();
  const float* ls_all = suffix_lse.data_as<const float>();
  float* lo_all = output_lse ? output_lse->data_as<float>() : nullptr;
  parallel_for(
      T * H,
      [&](int64_t row) {
        thread_local std::vector<float> buf;
        float* a = scratch(buf, 2 * static_cast<size_t>(D));
        float* b = a + D;
        const int64_t t = row / H, h = row % H;
        // +inf reads as -inf (vLLM): a log-sum-exp of no keys.
        auto read = [](float v) { return std::isinf(v) ? kNegInf : v; };
        const float lp = read(lp_all[h * T + t]), ls = read(ls_all[h * T + t]);
        const bool nan = std::isnan(lp) || std::isnan(ls);
        const float m = std::max(lp, ls);
        const float wp = nan || m == kNegInf ? 0.0f : std::exp(lp - m);
        const float ws = nan || m == kNegInf ? 0.0f : std::exp(ls - m);
        const float sum = wp + ws;  // 0: neither side has keys, a zero output
        load_row(pre.row(t, h), pre.dtype, a, D);
        load_row(suf.row(t, h), suf.dtype, b, D);
        for (int d = 0; d < D; ++d) {
          a[d] = nan ? NAN : sum > 0.0f ? (wp * a[d] + ws * b[d]) / sum : 0.0f;
        }
        store_row(a, out.dtype, out.row(t, h), D);
        if (lo_all != nullptr)
          lo_all[h * T + t] = nan ? NAN : sum > 0.0f ? m + std::log(sum) : kNegInf;
      },
      T * H * D);
}

}  // namespace pagedkv::cpu_ops
