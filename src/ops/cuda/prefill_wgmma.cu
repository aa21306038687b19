// Host side of the Hopper wgmma prefill: which calls the kernel covers, its tensor maps, and the
// per-dtype launch (kernels instantiated in prefill_wgmma_{f16,bf16}.cu).
#include <algorithm>
#include <atomic>
#include <cmath>

#include "ops/cuda/common.cuh"
#include "ops/cuda/device_props.h"
#include "ops/cuda/prefill_wgmma.h"
#include "ops/cuda/tensor_map.h"

namespace pagedkv::cuda_ops {
namespace {

// Whether the build carries the kernel's sm_90a code for `device`, checked once per device (the
// answer cannot change while the library is loaded).
bool sm90a_code(int device) {
  static std::atomic<int> known[kMaxCachedDevices];  // 1: yes, 2: no
  return cached_per_device(known, device, [] { return prefill_wg::has_sm90a_code() ? 1 : 2; }) == 1;
}

// New keys or values ([num_q, num_kv_heads, head_size], addressed as (token, 0, head, d)) as a
// 3-D tensor (dims, heads, tokens) with boxes of 16 tokens of one head and one 128-byte slice.
bool encode_new_map(CUtensorMap* map, const void* base, const CacheLayout& l, const AttnParams& p,
                    int rows) {
  const uint64_t dims[3] = {uint64_t(p.head_size), uint64_t(p.num_kv_heads), uint64_t(p.num_q)};
  const int64_t strides[2] = {l.s_head * 2, l.s_block * 2};
  const uint32_t box[3] = {64, 1, uint32_t(rows)};
  return l.whole_rows(p.head_size) && encode_sw128(map, base, 3, dims, strides, box, 2);
}

// Queries ([num_q, num_heads, head_size] with strides) as a 3-D tensor (dims, heads, tokens) whose
// box is one query tile: kTileRows / group tokens x the group's heads x one 128-byte slice, landing
// as kTileRows rows in (token, head) order.
bool encode_q_map(CUtensorMap* map, const AttnParams& p) {
  constexpr int kRows = prefill_wg::kTileRows;
  if (p.group <= 0 || kRows % p.group != 0 || kRows / p.group > 256) return false;
  const uint64_t dims[3] = {uint64_t(p.head_size), uint64_t(p.num_heads), uint64_t(p.num_q)};
  const int64_t strides[2] = {p.q_s_head * 2, p.q_s_tok * 2};
  const uint32_t box[3] = {64, uint32_t(p.group), uint32_t(kRows / p.group)};
  return encode_sw128(map, p.q, 3, dims, strides, box, 2);
}

// The output, like the queries, with boxes of half a query tile (a consumer warpgroup's rows).
bool encode_o_map(CUtensorMap* map, const AttnParams& p) {
  constexpr int kRows = prefill_wg::kTileRows / 2;
  if (p.group <= 0 || kRows % p.group != 0 || kRows / p.group > 256) return false;
  const uint64_t dims[3] = {uint64_t(p.head_size), uint64_t(p.num_heads), uint64_t(p.num_q)};
  const int64_t strides[2] = {p.o_s_head * 2, p.o_s_tok * 2};
  const uint32_t box[3] = {64, uint32_t(p.group), uint32_t(kRows / p.group)};
  return encode_sw128(map, p.out, 3, dims, strides, box, 2);
}

// Whether the k / v scales of an fp8 cache are normal numbers of the query dtype (fp16 when
// `half`), as the producer's in-place dequantisation multiplies by them in that dtype
// (Fp8Dequant); other scales leave the cached groups to the fp32 path through registers, and so
// do scales in device arrays, whose values the host does not read (that would synchronise).
bool scales_fit(const AttnParams& p, bool half) {
  const float lo = half ? 6.2e-5f : 1.2e-38f, hi = half ? 65504.f : 3.3e38f;
  auto fits = [&](const DeviceScale& s) {
    return s.ptr == nullptr && std::fabs(s.value) >= lo && std::fabs(s.value) <= hi;
  };
  return fits(p.k_scale) && fits(p.v_scale);
}

// Fills the maps the call allows (tensor_map.h); a missing map leaves its groups to cp.async.
// half: fp16 queries (else bf16).
void encode_maps(prefill_wg::WgParams& wp, bool half) {
  const AttnParams& p = wp.a;
  const bool rows16 =
      p.block_size % 16 == 0 && p.kl.whole_rows(p.head_size) && p.vl.whole_rows(p.head_size);
  // An fp8 cache's boxes land raw bytes, not the query dtype wgmma reads: the cache maps then
  // hold the rows unswizzled, and the producer dequantises them in place (raw_tma).
  const bool fp8 = wp.vf.cache_fp8 != kNoFp8;
  wp.cache_tma = rows16 && !fp8 && encode_cache_map(&wp.k_cache_map, p.k_cache, p.kl, p, 2) &&
                 encode_cache_map(&wp.v_cache_map, p.v_cache, p.vl, p, 2);
  wp.raw_tma = rows16 && fp8 && scales_fit(p, half) &&
               encode_cache_rows(&wp.k_cache_map, p.k_cache, p.kl, p) &&
               encode_cache_rows(&wp.v_cache_map, p.v_cache, p.vl, p);
  // Who dequantises the raw groups. H100, extend over a long fp8 prefix: for head size 64 the
  // consumers both halves (1.01-1.23x the producer alone, 0.96-1.08x V only), for 128 V only
  // (1.05-1.16x the producer alone; K too 5-9 % slower). benchmarks/RESULTS.md, "fp8 tiles
  // dequantised by the consumers".
  wp.consumer_dequant = wp.raw_tma ? (p.head_size == 64 ? 2 : 1) : 0;
  wp.q_tma = wp.vf.q && encode_q_map(&wp.q_map, p);
  wp.o_tma = wp.vf.out && encode_o_map(&wp.o_map, p);
  wp.new_tma = encode_new_map(&wp.k_new_map, p.k_new, p.knl, p, 16) &&
               encode_new_map(&wp.v_new_map, p.v_new, p.vnl, p, 16);
  // Cached blocks of more than 16 slots in one box each, where a block divides the key tile.
  const int bs = p.block_size;
  wp.block_rows = wp.cache_tma && bs > 16 && prefill_wg::kTileKeys % bs == 0 &&
                          encode_cache_map(&wp.k_block_map, p.k_cache, p.kl, p, 2, bs) &&
                          encode_cache_map(&wp.v_block_map, p.v_cache, p.vl, p, 2, bs)
                      ? bs
                      : 0;
  // Tiles of new tokens in whole-tile boxes: the TMA unit's cost is per box, and 16-token boxes
  // (2 KB each) kept the consumers waiting for data in the H100 profile.
  constexpr int kRows = prefill_wg::kTileKeys;
  wp.tile_rows = wp.new_tma && encode_new_map(&wp.k_tile_map, p.k_new, p.knl, p, kRows) &&
                         encode_new_map(&wp.v_tile_map, p.v_new, p.vnl, p, kRows)
                     ? kRows
                     : 0;
}

}  // namespace

const char* prefill_wgmma_uncovered(const AttnParams& p, DType qdtype, KVCacheDType cache) {
  const int dev = current_device();
  if (compute_major(dev) != 9) return "needs a compute capability 9.x (Hopper) device";
  if (!sm90a_code(dev)) return "not compiled for sm_90a (PAGEDKV_CUDA_ARCHS)";
  if (qdtype != DType::kFloat16 && qdtype != DType::kBFloat16) {
    return "queries must be float16 or bfloat16";
  }
  if (p.head_size != 64 && p.head_size != 128) return "head size must be 64 or 128";
  // The producer copies whole 16-byte runs of keys and values (cache and new tokens; 8-byte runs
  // of an fp8 cache, kv_vec's unit for one-byte elements).
  const prefill::VecFlags vf = prefill::vec_flags(p);
  if (!vf.k_cache || !vf.v_cache || !vf.fresh) {
    return "key / value rows (cache and new tokens) must be 16-byte runs (NHD cache layout)";
  }
  return nullptr;
}

void launch_prefill_wgmma(const AttnParams& p, DType qdtype, KVCacheDType cache, int max_query_len,
                          cudaStream_t s) {
  if (p.num_seqs == 0 || max_query_len <= 0) return;
  prefill_wg::WgParams wp{};
  wp.a = p;
  wp.vf = prefill::vec_flags(p);
  wp.vf.cache_fp8 = fp8_kind(cache);
  encode_maps(wp, qdtype == DType::kFloat16);
  if (qdtype == DType::kFloat16) {
    prefill_wg::launch_f16(wp, max_query_len, s);
  } else {
    prefill_wg::launch_bf16(wp, max_query_len, s);
  }
}

}  // namespace pagedkv::cuda_ops
