// CPU int4 GEMM: x converted to fp32 once; each task dequantises a chunk of weight rows to fp32
// (a tile that stays in cache, never the whole matrix) and multiplies it with every row of x.
#include "ops/cpu/quant.h"

#include <algorithm>
#include <vector>

#include "ops/cpu/parallel.h"
#include "ops/cpu/vec.h"

namespace pagedkv::cpu_ops {
namespace {

constexpr int kRowChunk = 16;  // weight rows (output columns) per task

// Rows n0 .. n0 + nc of W as fp32 [nc, K].
void dequantize_rows(const TensorView& qweight, const TensorView& scales, const TensorView& zeros,
                     int group_size, int64_t n0, int nc, float* dst) {
  const int64_t K = qweight.size(1) * 2, groups = K / group_size;
  const size_t es = scales.element_size();
  std::vector<float> s(groups);
  for (int r = 0; r < nc; ++r) {
    const int64_t n = n0 + r;
    load_row(static_cast<const char*>(scales.data()) + n * groups * int64_t(es), scales.dtype(),
             s.data(), static_cast<int>(groups));
    const uint8_t* q = qweight.data_as<const uint8_t>() + n * (K / 2);
    const uint8_t* z = zeros.data_as<const uint8_t>() + n * groups;
    float* d = dst + r * K;
    for (int64_t g = 0; g < groups; ++g) {
      const float scale = s[g], zero = static_cast<float>(z[g]);
      for (int64_t k = g * group_size; k < (g + 1) * group_size; k += 2) {
        const uint8_t byte = q[k / 2];
        d[k] = (static_cast<float>(byte & 0xf) - zero) * scale;
        d[k + 1] = (static_cast<float>(byte >> 4) - zero) * scale;
      }
    }
  }
}

}  // namespace

PAGEDKV_MULTIVERSION
void int4_gemm(const TensorView& out, const TensorView& x, const TensorView& qweight,
               const TensorView& scales, const TensorView& zeros, int group_size) {
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  std::vector<float> X(static_cast<size_t>(M * K));
  const int64_t xs = x.stride(0) * static_cast<int64_t>(x.element_size());
  for (int64_t m = 0; m < M; ++m)
    load_row(static_cast<const char*>(x.data()) + m * xs, x.dtype(), X.data() + m * K,
             static_cast<int>(K));
  const int64_t os = out.stride(0) * static_cast<int64_t>(out.element_size());
  parallel_for(
      (N + kRowChunk - 1) / kRowChunk,
      [&](int64_t task) {
        const int64_t n0 = task * kRowChunk;
        const int nc = static_cast<int>(std::min<int64_t>(kRowChunk, N - n0));
        thread_local std::vector<float> W, S;
        W.resize(static_cast<size_t>(nc) * K);
        S.resize(static_cast<size_t>(M) * nc);
        dequantize_rows(qweight, scales, zeros, group_size, n0, nc, W.data());
        dot_tile<false>(X.data(), K, static_cast<int>(M), W.data(), K, nc, static_cast<int>(K),
                        S.data(), nc);
        for (int64_t m = 0; m < M; ++m)
          store_row(S.data() + m * nc, out.dtype(),
                    static_cast<char*>(out.data()) + m * os +
                        n0 * static_cast<int64_t>(out.element_size()),
                    nc);
      },
      M * N * K);
}

}  // namespace pagedkv::cpu_ops
