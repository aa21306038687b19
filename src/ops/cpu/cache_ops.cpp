// Cache writes and block moves: reshape_and_cache (vLLM layout), reshape_and_cache_flash (NHD),
// copy_blocks and swap_blocks. With kv_cache_dtype "auto" the cache has the key's dtype and
// elements are copied bit for bit; with fp8 each element is stored as fp8(value / scale).
#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/cpu/attention_common.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/fp8.h"
#include "ops/cpu/parallel.h"

namespace pagedkv::cpu_ops {
namespace {

// Destination of element (token offset t, head h, dim d) inside one block, in elements.
struct SlotLayout {
  KVLayout layout;
  bool is_key;
  int64_t H, D, bs, x;
  int64_t offset(int64_t t, int64_t h, int64_t d) const {
    if (layout == KVLayout::kNHD) return (t * H + h) * D + d;
    const int64_t head = h * D * bs;
    if (is_key) return head + (d / x) * bs * x + t * x + d % x;
    return head + d * bs + t;
  }
};

// Writes the [H, D] rows of one token into one cache.
void write_token(const RowArray& src, int64_t token, char* block, const SlotLayout& lay, int64_t t,
                 bool fp8, Fp8Format fmt, float inv_scale, int64_t elem, std::vector<float>& tmp) {
  const int D = static_cast<int>(lay.D);
  for (int64_t h = 0; h < lay.H; ++h) {
    const char* row = src.row(token, h);
    if (!fp8) {
      if (lay.layout == KVLayout::kNHD) {  // the whole row is contiguous
        std::memcpy(block + lay.offset(t, h, 0) * elem, row, D * elem);
      } else if (lay.is_key) {  // runs of x elements
        for (int64_t d = 0; d < D; d += lay.x)
          std::memcpy(block + lay.offset(t, h, d) * elem, row + d * elem, lay.x * elem);
      } else {
        for (int64_t d = 0; d < D; ++d)
          std::memcpy(block + lay.offset(t, h, d) * elem, row + d * elem, elem);
      }
      continue;
    }
    if (tmp.size() < static_cast<size_t>(D)) tmp.resize(D);
    load_row(row, src.dtype, tmp.data(), D);
    for (int64_t d = 0; d < D; ++d)
      reinterpret_cast<uint8_t*>(block)[lay.offset(t, h, d)] =
          float_to_fp8(tmp[d] * inv_scale, fmt);
  }
}

void write_cache(const TensorView& key, const TensorView& value, const TensorView& key_cache,
                 const TensorView& value_cache, const TensorView& slot_mapping,
                 KVCacheDType kv_dtype, float k_scale, float v_scale, KVLayout layout) {
  const RowArray k(key), v(value);
  const IntArray slots(slot_mapping);
  const int64_t n = slot_mapping.size(0);
  const int64_t H = key.size(1), D = key.size(2);
  const int64_t elem = static_cast<int64_t>(key_cache.element_size());
  const int64_t bs = layout == KVLayout::kNHD ? key_cache.size(1) : key_cache.size(3);
  const SlotLayout k_lay{layout, true, H, D, bs, 16 / elem};
  const SlotLayout v_lay{layout, false, H, D, bs, 16 / elem};
  const bool fp8 = kv_dtype != KVCacheDType::kAuto;
  const Fp8Format fmt = fp8_format(kv_dtype);
  const int64_t kstride = key_cache.stride(0) * elem, vstride = value_cache.stride(0) * elem;
  char* kbase = static_cast<char*>(key_cache.data());
  char* vbase = static_cast<char*>(value_cache.data());
  // Tokens in chunks: each chunk is a parallel item (slots are distinct, so no write races).
  constexpr int64_t kChunk = 16;
  parallel_for(
      (n + kChunk - 1) / kChunk,
      [&](int64_t c) {
        thread_local std::vector<float> tmp;
        for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) {
          const int64_t slot = slots[i];
          if (slot < 0) continue;  // padding token
          const int64_t b = slot / bs, t = slot % bs;
          write_token(k, i, kbase + b * kstride, k_lay, t, fp8, fmt, 1.0f / k_scale, elem, tmp);
          write_token(v, i, vbase + b * vstride, v_lay, t, fp8, fmt, 1.0f / v_scale, elem, tmp);
        }
      },
      n * H * D * 2 * (fp8 ? 8 : 1));
}

// Bytes of one block (all dims after the first, which are contiguous).
int64_t block_bytes(const TensorView& cache) {
  return cache.numel() / std::max<int64_t>(cache.size(0), 1) *
         static_cast<int64_t>(cache.element_size());
}

}  // namespace

void reshape_and_cache(const TensorView& key, const TensorView& value, const TensorView& key_cache,
                       const TensorView& value_cache, const TensorView& slot_mapping,
                       KVCacheDType kv_cache_dtype, float k_scale, float v_scale) {
  write_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
              KVLayout::kVLLM);
}

void reshape_and_cache_flash(const TensorView& key, const TensorView& value,
                             const TensorView& key_cache, const TensorView& value_cache,
                             const TensorView& slot_mapping, KVCacheDType kv_cache_dtype,
                             float k_scale, float v_scale) {
  write_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
              KVLayout::kNHD);
}

void copy_blocks(const std::vector<TensorView>& key_caches,
                 const std::vector<TensorView>& value_caches, const TensorView& block_mapping) {
  const int64_t pairs = block_mapping.size(0);
  const int64_t* map = block_mapping.data_as<const int64_t>();
  const int64_t m0 = block_mapping.stride(0), m1 = block_mapping.stride(1);
  const int64_t layers = static_cast<int64_t>(key_caches.size());
  // One item per (layer, key|value); pairs run in order inside an item, so chained copies
  // (a -> b, b -> c) behave as a sequential loop would.
  parallel_for(
      layers * 2,
      [&](int64_t item) {
        const TensorView& c = item % 2 == 0 ? key_caches[item / 2] : value_caches[item / 2];
        const int64_t bytes = block_bytes(c);
        const int64_t stride = c.stride(0) * static_cast<int64_t>(c.element_size());
        char* base = static_cast<char*>(c.data());
        for (int64_t i = 0; i < pairs; ++i) {
          const int64_t src = map[i * m0], dst = map[i * m0 + m1];
          if (src != dst) std::memmove(base + dst * stride, base + src * stride, bytes);
        }
      },
      layers * pairs * (key_caches.empty() ? 0 : block_bytes(key_caches[0])) / 4);
}

void swap_blocks(const TensorView& src, const TensorView& dst, const TensorView& block_mapping) {
  const int64_t pairs = block_mapping.size(0);
  const int64_t* map = block_mapping.data_as<const int64_t>();
  const int64_t m0 = block_mapping.stride(0), m1 = block_mapping.stride(1);
  const int64_t bytes = block_bytes(src);
  const int64_t ss = src.stride(0) * static_cast<int64_t>(src.element_size());
  const int64_t ds = dst.stride(0) * static_cast<int64_t>(dst.element_size());
  const char* sb = static_cast<const char*>(src.data());
  char* db = static_cast<char*>(dst.data());
  for (int64_t i = 0; i < pairs; ++i)
    std::memmove(db + map[i * m0 + m1] * ds, sb + map[i * m0] * ss, bytes);
}

}  // namespace pagedkv::cpu_ops
