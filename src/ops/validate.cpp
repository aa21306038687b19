// Argument validation shared by both backends (see validate.h).
#include "ops/validate.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>

namespace pagedkv::ops::detail {

namespace {
bool same_device(const Device& a, const Device& b) {
  if (a.is_cuda() || b.is_cuda()) return a == b;
  return true;  // CPU and pinned host memory are both host memory
}
}  // namespace

bool block_contiguous(const TensorView& t) {
  if (t.numel() == 0) return true;  // size-0 arrays have arbitrary strides (numpy: all 0)
  int64_t expected = 1;
  for (int d = t.ndim() - 1; d >= 1; --d) {
    if (t.size(d) != 1 && t.stride(d) != expected) return false;
    expected *= t.size(d);
  }
  return true;
}

void check_data(NamedList arrays) {
  for (const Named& a : arrays) {
    PAGEDKV_CHECK(a.t->ndim() >= 0, a.name, " is undefined (a default-constructed TensorView)");
    PAGEDKV_CHECK(a.t->data() != nullptr || a.t->numel() == 0, a.name,
                  " has a null data pointer but shape ", a.t->shape_str());
  }
}

void check_devices(NamedList arrays) {
  check_data(arrays);
  const Named* first = arrays.begin();
  for (const Named& a : arrays) {
    PAGEDKV_CHECK(same_device(first->t->device(), a.t->device()), first->name, " is on ",
                  first->t->device().str(), " but ", a.name, " is on ", a.t->device().str(),
                  ": all arrays of an op must be on the same device");
  }
}

namespace {

// Byte range [lo, hi) covered by the elements of `t`; lo == hi when it has none.
std::pair<uintptr_t, uintptr_t> byte_range(const TensorView& t) {
  if (t.numel() == 0 || t.data() == nullptr) return {0, 0};
  const int64_t es = static_cast<int64_t>(t.element_size());
  int64_t lo = 0, hi = es;
  for (int d = 0; d < t.ndim(); ++d) {
    const int64_t off = (t.size(d) - 1) * t.stride(d) * es;
    (off < 0 ? lo : hi) += off;
  }
  const auto base = reinterpret_cast<uintptr_t>(t.data());
  return {base + static_cast<uintptr_t>(lo), base + static_cast<uintptr_t>(hi)};
}

std::string strides_str(const TensorView& t) {
  std::string s = "[";
  for (int d = 0; d < t.ndim(); ++d) {
    s += d ? ", " : "";
    s += std::to_string(t.stride(d));
  }
  return s + "]";
}

}  // namespace

void check_no_self_overlap(const TensorView& t, std::string_view name) {
  if (t.numel() == 0) return;  // nothing is written (size-0 arrays have arbitrary strides)
  std::array<std::pair<int64_t, int64_t>, TensorView::kMaxDims> dims{};  // (|stride|, size)
  int n = 0;
  for (int d = 0; d < t.ndim(); ++d) {
    if (t.size(d) > 1) dims[n++] = {std::llabs(t.stride(d)), t.size(d)};
  }
  std::sort(dims.begin(), dims.begin() + n);
  int64_t reach = 0;  // offsets (elements) spanned by the dims checked so far
  for (int i = 0; i < n; ++i) {
    PAGEDKV_CHECK(dims[i].first > reach, name, " (shape ", t.shape_str(), ", strides ",
                  strides_str(t),
                  ") repeats elements: the op writes it, so it must not be an expanded / "
                  "broadcast view (pass a real array)");
    reach += (dims[i].second - 1) * dims[i].first;
  }
}

void check_no_overlap(const Named& out, NamedList reads) {
  const auto [lo, hi] = byte_range(*out.t);
  if (lo == hi) return;
  for (const Named& r : reads) {
    const auto [rlo, rhi] = byte_range(*r.t);
    PAGEDKV_CHECK(rlo == rhi || rhi <= lo || hi <= rlo, out.name, " overlaps ", r.name,
                  " in memory: the op writes ", out.name, " while it reads ", r.name,
                  ", so they must be separate arrays (no in-place use, no views of one buffer)");
  }
}

void check_cuda_dense(const TensorView& t, std::string_view name) {
  if (!t.device().is_cuda() || t.ndim() < 1) return;
  PAGEDKV_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, name,
                " must be contiguous along its last dimension on CUDA (the kernels read it "
                "with unit stride), got strides ",
                strides_str(t), " for shape ", t.shape_str());
}

void check_float(const TensorView& t, std::string_view name) {
  check_dtype(t, name, {DType::kFloat32, DType::kFloat16, DType::kBFloat16});
}

void check_rows(const TensorView& t, std::string_view name, int64_t n0, int64_t n1, int64_t d) {
  check_shape(t, name, {n0, n1, d});
  PAGEDKV_CHECK(t.is_last_dim_contiguous(), name,
                " must be contiguous in its last dimension (strides of other dims are free)");
}

void check_head_size(int64_t head_size, std::string_view name) {
  if (is_supported_head_size(static_cast<int>(head_size))) return;
  std::string sizes;
  for (const int s : kSupportedHeadSizes) sizes += (sizes.empty() ? "" : ", ") + std::to_string(s);
  PAGEDKV_CHECK(false, name, ": head size ", head_size, " is not supported (supported: ", sizes,
                ")");
}

namespace {

void check_scale(const Scale& s, std::string_view name, const Device& device) {
  float v = s.value;
  if (s.array) {
    const TensorView& a = *s.array;
    check_data({{&a, name}});
    check_dtype(a, name, {DType::kFloat32});
    PAGEDKV_CHECK(a.numel() == 1, name, " must be a number or a 1-element array, got shape ",
                  a.shape_str());
    PAGEDKV_CHECK(same_device(a.device(), device), name, " is on ", a.device().str(),
                  " but the op's arrays are on ", device.str());
    if (a.device().is_cuda()) return;  // read by the kernels: checking it would synchronise
    v = *a.data_as<const float>();
  }
  // The fp8 writes store value / scale (the CPU as value * (1 / scale)): a scale whose
  // reciprocal overflows (below ~2.9e-39, denormals) would store 0 * inf = NaN for every zero on
  // the CPU and saturate on the GPU, so it is refused like 0.
  PAGEDKV_CHECK(std::isfinite(v) && v > 0 && std::isfinite(1.0f / v), name,
                " must be a positive finite number with a finite reciprocal, got ", v);
}

}  // namespace

void check_scales(const Scale& k_scale, const Scale& v_scale, const Device& device) {
  check_scale(k_scale, "k_scale", device);
  check_scale(v_scale, "v_scale", device);
}

CacheGeometry check_kv_caches(const TensorView& kc, const TensorView& vc, KVCacheDType kv_dtype,
                              DType dtype, const KVLayout* want) {
  PAGEDKV_CHECK(kc.ndim() == 5 || kc.ndim() == 4,
                "key_cache must have rank 5 (vLLM layout "
                "[num_blocks, num_kv_heads, head_size/x, block_size, x]) or rank 4 (NHD layout "
                "[num_blocks, block_size, num_kv_heads, head_size]), got shape ",
                kc.shape_str());
  const KVLayout layout = kc.ndim() == 5 ? KVLayout::kVLLM : KVLayout::kNHD;
  if (want && *want != layout) {
    PAGEDKV_CHECK(false, "key_cache must have rank ", *want == KVLayout::kVLLM ? 5 : 4,
                  " for this op (", *want == KVLayout::kVLLM ? "vLLM" : "NHD",
                  " layout), got shape ", kc.shape_str());
  }
  if (kv_dtype == KVCacheDType::kAuto) {
    check_dtype(kc, "key_cache", {dtype});
    check_dtype(vc, "value_cache", {dtype});
  } else {
    PAGEDKV_CHECK_TYPE(kc.dtype() == DType::kUInt8,
                       "key_cache must be uint8 for an fp8 "
                       "kv_cache_dtype, got ",
                       dtype_name(kc.dtype()));
    PAGEDKV_CHECK_TYPE(vc.dtype() == DType::kUInt8,
                       "value_cache must be uint8 for an fp8 "
                       "kv_cache_dtype, got ",
                       dtype_name(vc.dtype()));
  }
  PAGEDKV_CHECK(block_contiguous(kc), "key_cache must be contiguous (except along num_blocks)");
  PAGEDKV_CHECK(block_contiguous(vc), "value_cache must be contiguous (except along num_blocks)");
  CacheGeometry g{};
  g.layout = layout;
  g.num_blocks = kc.size(0);
  if (layout == KVLayout::kVLLM) {
    const int64_t x = 16 / static_cast<int64_t>(kc.element_size());
    PAGEDKV_CHECK(kc.size(4) == x, "key_cache: last dimension must be x = 16 / element size = ", x,
                  ", got shape ", kc.shape_str());
    g.num_kv_heads = kc.size(1);
    g.head_size = kc.size(2) * x;
    g.block_size = kc.size(3);
    check_shape(vc, "value_cache", {g.num_blocks, g.num_kv_heads, g.head_size, g.block_size});
  } else {
    g.block_size = kc.size(1);
    g.num_kv_heads = kc.size(2);
    g.head_size = kc.size(3);
    check_shape(vc, "value_cache", {g.num_blocks, g.block_size, g.num_kv_heads, g.head_size});
  }
  PAGEDKV_CHECK(g.block_size > 0, "key_cache: block_size must be positive");
  return g;
}

void check_attention_options(const AttentionOptions& o, int64_t num_heads, const Device& device) {
  PAGEDKV_CHECK(std::isfinite(o.scale), "scale must be finite, got ", o.scale);
  PAGEDKV_CHECK(std::isfinite(o.logits_soft_cap) && o.logits_soft_cap >= 0,
                "logits_soft_cap must be >= 0 (0 = off), got ", o.logits_soft_cap);
  check_scales(o.k_scale, o.v_scale, device);
  // A window counts back from each query's position: without causality it has no single meaning.
  PAGEDKV_CHECK(o.causal || o.sliding_window <= 0, "sliding_window (", o.sliding_window,
                ") needs causal attention; causal=False attends to the whole sequence");
  if (o.alibi_slopes) {
    check_dtype(*o.alibi_slopes, "alibi_slopes", {DType::kFloat32});
    check_shape(*o.alibi_slopes, "alibi_slopes", {num_heads});
    check_cuda_dense(*o.alibi_slopes, "alibi_slopes");
  }
  const bool gpu_kernel = o.kernel != AttentionKernel::kAuto && o.kernel != AttentionKernel::kCpu;
  PAGEDKV_CHECK(o.kernel == AttentionKernel::kAuto || gpu_kernel == device.is_cuda(), "kernel '",
                attention_kernel_name(o.kernel), "' runs on ", gpu_kernel ? "CUDA" : "host",
                " arrays, but the arrays are on ", device.str());
}

int64_t host_int(const TensorView& t, int64_t i) {
  const char* p = static_cast<const char*>(t.data()) + i * t.stride(0) * t.element_size();
  return t.dtype() == DType::kInt64 ? *reinterpret_cast<const int64_t*>(p)
                                    : *reinterpret_cast<const int32_t*>(p);
}

void check_seq_blocks(const TensorView& bt, int64_t seq, int64_t first, int64_t end,
                      const CacheGeometry& g) {
  if (end <= first) return;
  const int64_t cap = bt.size(1) * g.block_size;
  PAGEDKV_CHECK(end <= cap, "seq_lens[", seq, "] = ", end,
                " exceeds the block table: ", "block_tables has ", bt.size(1),
                " blocks per sequence of block_size ", g.block_size, " (", cap, " tokens)");
  const int32_t* row = bt.data_as<const int32_t>() + seq * bt.stride(0);
  for (int64_t b = first / g.block_size; b <= (end - 1) / g.block_size; ++b) {
    const int64_t id = row[b * bt.stride(1)];
    PAGEDKV_CHECK(id >= 0 && id < g.num_blocks, "block_tables[", seq, ", ", b, "] = ", id,
                  " is out of range [0, ", g.num_blocks, ")");
  }
}

void check_block_mapping(const TensorView& m, std::string_view name, int64_t src_blocks,
                         int64_t dst_blocks) {
  check_dtype(m, name, {DType::kInt64});
  check_shape(m, name, {-1, 2});
  if (m.device().is_cuda()) return;
  const int64_t* p = m.data_as<const int64_t>();
  for (int64_t i = 0; i < m.size(0); ++i) {
    const int64_t s = p[i * m.stride(0)], d = p[i * m.stride(0) + m.stride(1)];
    PAGEDKV_CHECK(s >= 0 && s < src_blocks, name, "[", i, ", 0] = ", s, " is out of range [0, ",
                  src_blocks, ")");
    PAGEDKV_CHECK(d >= 0 && d < dst_blocks, name, "[", i, ", 1] = ", d, " is out of range [0, ",
                  dst_blocks, ")");
  }
}

}  // namespace pagedkv::ops::detail
