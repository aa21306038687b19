// CPU MoE kernels: top-k softmax routing, the block-aligned sort by expert, and the grouped GEMM
// (one task per (block of rows of one expert, chunk of output columns), fp32 accumulation).
#include "ops/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/parallel.h"
#include "ops/cpu/vec.h"

namespace pagedkv::cpu_ops {
namespace {

// Output columns per grouped-GEMM task: enough work per task, and a [chunk, K] fp32 copy of the
// expert's rows that stays in L2.
constexpr int kColumnChunk = 64;

// Element `i` of a [rows, cols] row-major-with-row-stride int32 / float32 array.
template <typename T>
T& at(const TensorView& t, int64_t row, int64_t col) {
  return t.data_as<T>()[row * t.stride(0) + col * t.stride(1)];
}

}  // namespace

PAGEDKV_MULTIVERSION
void topk_softmax(const TensorView& topk_weights, const TensorView& topk_ids,
                  const TensorView& gating_output, bool renormalize) {
  const int64_t T = gating_output.size(0), E = gating_output.size(1), k = topk_ids.size(1);
  const size_t es = gating_output.element_size();
  parallel_for(
      T,
      [&](int64_t t) {
        thread_local std::vector<float> prob;
        prob.resize(E);
        const char* row = static_cast<const char*>(gating_output.data()) +
                          t * gating_output.stride(0) * static_cast<int64_t>(es);
        load_row(row, gating_output.dtype(), prob.data(), static_cast<int>(E));
        const float mx = max_of(prob.data(), static_cast<int>(E), -INFINITY);
        float sum = 0.0f;
        for (int64_t e = 0; e < E; ++e) sum += (prob[e] = std::exp(prob[e] - mx));
        // Repeated arg-max (k is small); a taken expert is marked -1 (probabilities are >= 0),
        // and a tie keeps the lower expert id.
        float picked = 0.0f;
        for (int64_t j = 0; j < k; ++j) {
          int64_t best = 0;
          for (int64_t e = 1; e < E; ++e) best = prob[e] > prob[best] ? e : best;
          at<float>(topk_weights, t, j) = prob[best] / sum;
          at<int32_t>(topk_ids, t, j) = static_cast<int32_t>(best);
          picked += prob[best] / sum;
          prob[best] = -1.0f;
        }
        if (renormalize && picked > 0.0f) {
          for (int64_t j = 0; j < k; ++j) at<float>(topk_weights, t, j) /= picked;
        }
      },
      T * E * 8);
}

void moe_align_block_size(const TensorView& topk_ids, int num_experts, int block_size,
                          const TensorView& sorted_token_ids, const TensorView& expert_ids,
                          const TensorView& num_tokens_post_pad) {
  const int64_t T = topk_ids.size(0), k = topk_ids.size(1), pairs = T * k;
  auto id_of = [&](int64_t i) { return at<int32_t>(topk_ids, i / k, i % k); };
  std::vector<int64_t> start(num_experts + 1, 0);
  for (int64_t i = 0; i < pairs; ++i) ++start[id_of(i) + 1];
  for (int e = 0; e < num_experts; ++e) {
    const int64_t padded = (start[e + 1] + block_size - 1) / block_size * block_size;
    start[e + 1] = start[e] + padded;
  }
  int32_t* sorted = sorted_token_ids.data_as<int32_t>();
  const int64_t s_stride = sorted_token_ids.stride(0);
  for (int64_t r = 0; r < sorted_token_ids.size(0); ++r) sorted[r * s_stride] = int32_t(pairs);
  int32_t* blocks = expert_ids.data_as<int32_t>();
  const int64_t b_stride = expert_ids.stride(0);
  for (int64_t b = 0; b < expert_ids.size(0); ++b) blocks[b * b_stride] = -1;
  for (int e = 0; e < num_experts; ++e)
    for (int64_t b = start[e] / block_size; b < start[e + 1] / block_size; ++b)
      blocks[b * b_stride] = e;
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < pairs; ++i) sorted[next[id_of(i)]++ * s_stride] = int32_t(i);
  *num_tokens_post_pad.data_as<int32_t>() = static_cast<int32_t>(start[num_experts]);
}

PAGEDKV_MULTIVERSION
void moe_grouped_gemm(const TensorView& out, const TensorView& a, const TensorView& w,
                      const TensorView& sorted_token_ids, const TensorView& expert_ids,
                      const TensorView& num_tokens_post_pad, int top_k, int block_size,
                      const std::optional<TensorView>& topk_weights) {
  const int64_t pairs = out.size(0), N = out.size(1), K = a.size(1);
  const int64_t used = *num_tokens_post_pad.data_as<const int32_t>();
  const int64_t num_blocks = (used + block_size - 1) / block_size;
  const int64_t chunks = (N + kColumnChunk - 1) / kColumnChunk;
  const size_t es = a.element_size();
  const DType dt = a.dtype();
  // topk_weights is [T*k] or [T, k]: the weight of pair i.
  auto weight_of = [&](int64_t i) -> float {
    const TensorView& tw = *topk_weights;
    if (tw.ndim() == 1) return tw.data_as<const float>()[i * tw.stride(0)];
    const int64_t k = tw.size(1);
    return tw.data_as<const float>()[(i / k) * tw.stride(0) + (i % k) * tw.stride(1)];
  };
  auto row_ptr = [](const TensorView& t, int64_t row, size_t es) {
    return static_cast<char*>(t.data()) + row * t.stride(0) * static_cast<int64_t>(es);
  };
  parallel_for(
      num_blocks * chunks,
      [&](int64_t task) {
        const int64_t b = task / chunks, n0 = (task % chunks) * kColumnChunk;
        const int nc = static_cast<int>(std::min<int64_t>(kColumnChunk, N - n0));
        thread_local std::vector<float> A, B, S;
        thread_local std::vector<int64_t> rows;
        rows.clear();
        for (int64_t r = b * block_size; r < std::min<int64_t>(used, (b + 1) * block_size); ++r) {
          const int64_t i = sorted_token_ids.data_as<const int32_t>()[r * sorted_token_ids.stride(0)];
          if (i < pairs) rows.push_back(i);
        }
        const int R = static_cast<int>(rows.size());
        if (R == 0) return;
        const int64_t e = expert_ids.data_as<const int32_t>()[b * expert_ids.stride(0)];
        S.assign(static_cast<size_t>(R) * nc, 0.0f);
        if (e >= 0) {
          A.resize(static_cast<size_t>(R) * K);
          for (int r = 0; r < R; ++r)
            load_row(row_ptr(a, rows[r] / top_k, es), dt, A.data() + r * K, static_cast<int>(K));
          B.resize(static_cast<size_t>(nc) * K);
          const char* wb = static_cast<const char*>(w.data()) +
                           (e * N + n0) * K * static_cast<int64_t>(es);
          load_row(wb, dt, B.data(), static_cast<int>(nc * K));
          dot_tile<false>(A.data(), K, R, B.data(), K, nc, static_cast<int>(K), S.data(), nc);
        }
        for (int r = 0; r < R; ++r) {
          float* s = S.data() + r * nc;
          if (topk_weights) scale_row(weight_of(rows[r]), s, nc);
          store_row(s, out.dtype(), row_ptr(out, rows[r], out.element_size()) + n0 * out.element_size(),
                    nc);
        }
      },
      used * N * K);
}

}  // namespace pagedkv::cpu_ops
