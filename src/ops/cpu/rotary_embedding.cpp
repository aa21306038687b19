// Rotary position embedding on the CPU, in place on query and key: one parallel item per token.
#include <vector>

#include "ops/cpu/attention_common.h"
#include "ops/cpu/layer_ops.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/vec.h"
#include "ops/layer_rows.h"

namespace pagedkv::cpu_ops {
namespace {

struct Rotation {
  DType dtype;
  int half;  // rotary_dim / 2
  bool is_neox;
  const float* cos;  // [half], already rounded to dtype
  const float* sin;
};

// Rotates the first 2 * half dims of the fp32 row x as HF's eager formula does in `dtype`:
// out1 = x1 cos - x2 sin, out2 = x2 cos + x1 sin, each product and sum rounded.
void rotate(float* x, const Rotation& r) {
  for (int i = 0; i < r.half; ++i) {
    const int i1 = r.is_neox ? i : 2 * i, i2 = r.is_neox ? i + r.half : 2 * i + 1;
    const float x1 = x[i1], x2 = x[i2], c = r.cos[i], s = r.sin[i];
    const DType t = r.dtype;
    x[i1] = round_to(t, round_to(t, x1 * c) - round_to(t, x2 * s));
    x[i2] = round_to(t, round_to(t, x2 * c) + round_to(t, x1 * s));
  }
}

void rotate_heads(const TensorView& a, int64_t token, const Rotation& r, std::vector<float>& buf) {
  const int64_t heads = a.size(1), dims = 2 * r.half;
  const size_t es = a.element_size();
  char* base = static_cast<char*>(a.data());
  for (int64_t h = 0; h < heads; ++h) {
    char* p = base + (token * a.stride(0) + h * a.stride(1)) * static_cast<int64_t>(es);
    load_row(p, a.dtype(), buf.data(), static_cast<int>(dims));
    rotate(buf.data(), r);
    store_row(buf.data(), a.dtype(), p, static_cast<int>(dims));
  }
}

}  // namespace

void rotary_embedding(const TensorView& positions, const TensorView& query,
                      const std::optional<TensorView>& key, const TensorView& cos_sin_cache,
                      bool is_neox) {
  const IntArray pos(positions);
  const int64_t tokens = positions.size(0);
  const int rot = static_cast<int>(cos_sin_cache.size(1));
  const size_t ces = cos_sin_cache.element_size();
  const char* cache = static_cast<const char*>(cos_sin_cache.data());
  const int64_t cache_row = cos_sin_cache.stride(0) * static_cast<int64_t>(ces);
  const int64_t heads = query.size(1) + (key ? key->size(1) : 0);
  parallel_for(
      tokens,
      [&](int64_t t) {
        thread_local std::vector<float> cs, buf;
        if (cs.size() < static_cast<size_t>(rot)) cs.resize(rot);
        if (buf.size() < static_cast<size_t>(rot)) buf.resize(rot);
        load_row(cache + pos[t] * cache_row, cos_sin_cache.dtype(), cs.data(), rot);
        for (int i = 0; i < rot; ++i) cs[i] = round_to(query.dtype(), cs[i]);
        const Rotation r{query.dtype(), rot / 2, is_neox, cs.data(), cs.data() + rot / 2};
        rotate_heads(query, t, r, buf);
        if (key) rotate_heads(*key, t, r, buf);
      },
      tokens * heads * rot * 4);
}

}  // namespace pagedkv::cpu_ops
