// CPU multi-LoRA kernels: one task per token (shrink) or per (token, chunk of output columns)
// (expand); each task converts its adapter's rows to fp32 and accumulates in fp32.
#include "ops/cpu/lora.h"

#include <algorithm>
#include <vector>

#include "ops/cpu/parallel.h"
#include "ops/cpu/vec.h"

namespace pagedkv::cpu_ops {
namespace {

// Output columns per expand task: a [chunk, r] fp32 copy of the adapter's B rows stays in L1.
constexpr int64_t kColumnChunk = 256;

int32_t index_of(const TensorView& idx, int64_t t) {
  return idx.data_as<const int32_t>()[t * idx.stride(0)];
}

char* row_ptr(const TensorView& t, int64_t row) {
  return static_cast<char*>(t.data()) + row * t.stride(0) * static_cast<int64_t>(t.element_size());
}

}  // namespace

PAGEDKV_MULTIVERSION
void lora_shrink(const TensorView& buf, const TensorView& x, const TensorView& a,
                 const TensorView& token_lora_indices) {
  const int64_t T = x.size(0), K = x.size(1), R = a.size(1);
  const size_t es = a.element_size();
  parallel_for(
      T,
      [&](int64_t t) {
        float* out = reinterpret_cast<float*>(row_ptr(buf, t));
        const int32_t l = index_of(token_lora_indices, t);
        if (l < 0) {
          std::fill(out, out + R, 0.0f);
          return;
        }
        thread_local std::vector<float> X, A;
        X.resize(K);
        A.resize(R * K);
        load_row(row_ptr(x, t), x.dtype(), X.data(), static_cast<int>(K));
        const char* al = static_cast<const char*>(a.data()) + l * R * K * static_cast<int64_t>(es);
        load_row(al, a.dtype(), A.data(), static_cast<int>(R * K));
        dot_tile<false>(X.data(), K, 1, A.data(), K, static_cast<int>(R), static_cast<int>(K), out,
                        R);
      },
      R * K * 2);
}

PAGEDKV_MULTIVERSION
void lora_expand(const TensorView& out, const TensorView& buf, const TensorView& b,
                 const TensorView& token_lora_indices, const std::vector<int64_t>& slice_sizes) {
  const int64_t T = out.size(0), N = out.size(1), r = b.size(2);
  const int64_t chunks = (N + kColumnChunk - 1) / kColumnChunk;
  const size_t es = b.element_size();
  parallel_for(
      T * chunks,
      [&](int64_t task) {
        const int64_t t = task / chunks, n0 = (task % chunks) * kColumnChunk;
        const int64_t n1 = std::min(N, n0 + kColumnChunk);
        const int32_t l = index_of(token_lora_indices, t);
        if (l < 0) return;
        thread_local std::vector<float> O, B;
        O.resize(n1 - n0);
        B.resize((n1 - n0) * r);
        char* orow = row_ptr(out, t) + n0 * static_cast<int64_t>(out.element_size());
        load_row(orow, out.dtype(), O.data(), static_cast<int>(n1 - n0));
        const char* bl =
            static_cast<const char*>(b.data()) + (l * N + n0) * r * static_cast<int64_t>(es);
        load_row(bl, b.dtype(), B.data(), static_cast<int>((n1 - n0) * r));
        const float* h = reinterpret_cast<const float*>(row_ptr(buf, t));
        // The columns [n0, n1) may cross slice boundaries: one dot_tile per slice piece.
        int64_t start = 0;
        for (size_t s = 0; s < slice_sizes.size(); ++s) {
          const int64_t lo = std::max(n0, start), hi = std::min(n1, start + slice_sizes[s]);
          start += slice_sizes[s];
          if (lo >= hi) continue;
          dot_tile<true>(h + static_cast<int64_t>(s) * r, r, 1, B.data() + (lo - n0) * r, r,
                         static_cast<int>(hi - lo), static_cast<int>(r), O.data() + (lo - n0),
                         n1 - n0);
        }
        store_row(O.data(), out.dtype(), orow, static_cast<int>(n1 - n0));
      },
      N * r * 2);
}

}  // namespace pagedkv::cpu_ops
