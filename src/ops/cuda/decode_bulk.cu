// Host side of the Hopper decode: which calls it covers, the shared-memory plan (copy form, ring
// depth, CTAs per SM) and the launch.
#include <algorithm>
#include <atomic>

#include "ops/cuda/decode_bulk.h"
#include "ops/cuda/decode_timeline.h"
#include "ops/cuda/device_props.h"
#include "ops/cuda/tensor_map.h"

namespace pagedkv::cuda_ops {
namespace {

constexpr int kWarps = 4;
constexpr int kSmemPerSm = 228 * 1024;  // sm_90: shared memory per SM, 1 KB of it per CTA reserved
constexpr int kCtaMax = 227 * 1024;     // sm_90: the most one CTA may use

// Dynamic shared memory of a launch: 1 KB of slack to align the rings to 1024 bytes, the rings,
// the query tile, the mbarriers.
int smem_bytes(const BulkDecodeParams& bp) {
  return 1024 + kWarps * bp.warp_bytes + bp.q_bytes + kWarps * kBulkMaxStages * 8;
}

// Resident CTAs per SM the rings are sized for: as many as fit with two stages per warp, at most
// 4 (16 warps; registers cap there). On an H100 that beat fewer, deeper rings on every benchmark
// shape (decode_variants.py: 3 vs 2 per SM for bf16, 4 vs 3 for fp8), wave tails included.
int cta_target(int per_cta_min, int most) {
  return std::clamp(kSmemPerSm / (per_cta_min + 2048), 1, most);
}

int round_up(int v, int to) { return (v + to - 1) / to * to; }

// Fills everything but the tensor maps; returns why the call is not covered, or nullptr. `tma`:
// whether tensor copies are wanted (the launch falls back to row copies if encoding fails).
const char* plan(const AttnParams& a, KVCacheDType cache, bool tma, BulkDecodeParams& bp) {
  const int D = a.head_size;
  const bool fp8 = fp8_kind(cache) != kNoFp8;
  if (!is_supported_head_size(D) || D % 16 != 0 || (fp8 && D % 32 != 0)) {
    // The head sizes decode_bulk.cuh's dispatch_head_size instantiates.
    return "head_size must be a supported size that is a multiple of 16 (of 32 with an fp8 cache)";
  }
  if (!a.kl.whole_rows(D) || !a.vl.whole_rows(D)) return "caches must use a row (NHD) layout";
  bp.a = a;
  bp.head_tiles = a.group > 8 ? 2 : 1;
  bp.gchunks = ceil_div(a.group, 8 * bp.head_tiles);
  bp.row_bytes = D * (fp8 ? 1 : 2);
  // Tensor copies where the rows allow them: 2-8 % faster than row copies (RESULTS.md).
  bp.tma = tma && bp.row_bytes % 128 == 0 && a.block_size % 16 == 0;
  bp.row_stride = bp.tma ? 128 : bp.row_bytes + 16;
  bp.box_bytes = bp.tma ? 16 * 128 : 128;
  bp.swz = bp.tma ? 7 : 0;
  bp.v_off = 16 * (bp.tma ? bp.row_bytes : bp.row_stride);
  bp.stage_bytes = 2 * bp.v_off;
  bp.q_bytes = round_up(8 * bp.head_tiles * (D + 8) * 2, 16);
  const int fixed = 1024 + bp.q_bytes + kWarps * kBulkMaxStages * 8;  // + alignment slack
  const int per_cta_min = fixed + kWarps * 2 * bp.stage_bytes;
  // Early-release kernels run no more CTAs per SM than their registers are capped for.
  const int most = bulk_early_release(D, bp.head_tiles) ? bulk_min_ctas(fp8, D, bp.head_tiles) : 4;
  bp.resident = cta_target(per_cta_min, most);
  const int budget = kSmemPerSm / bp.resident - 2048;  // reserved + static
  bp.stages = std::clamp((budget - fixed) / kWarps / bp.stage_bytes, 2, kBulkMaxStages);
  bp.warp_bytes = round_up(
      std::max(bp.stages * bp.stage_bytes, 8 * bp.head_tiles * bulk_out_pitch(D) * 4), 1024);
  // A sequence's KV heads launch together (0-5 % faster than a KV head's sequences: the
  // interleaved (slot, head) rows of a cache block are read by CTAs running at the same time),
  // where the sequences fit the grid's y dimension.
  bp.heads_first = (a.work_items != nullptr ? a.plan_items : a.num_q) <= 65535;
  if (smem_bytes(bp) > kCtaMax) return "the rings do not fit shared memory";
  return nullptr;
}

// The kernels' SASS architecture on `device` (queried once per device).
int binary_version(int device) {
  static std::atomic<int> cache[kMaxCachedDevices];
  return cached_per_device(cache, device, [] { return std::max(1, decode_bulk_binary_version()); });
}

}  // namespace

int decode_bulk_item_ctas(const AttnParams& p, KVCacheDType cache, int* resident) {
  BulkDecodeParams bp;
  plan(p, cache, false, bp);
  *resident = bp.resident;
  return p.num_kv_heads * bp.gchunks;
}

const char* decode_bulk_uncovered(const AttnParams& p, DType qdtype, KVCacheDType cache,
                                  bool vec16) {
  const int dev = current_device();
  if (compute_major(dev) < 9) return "needs a compute capability 9.x (Hopper) device";
  if (binary_version(dev) < 90) return "not compiled for sm_90a (PAGEDKV_CUDA_ARCHS)";
  if (qdtype != DType::kFloat16 && qdtype != DType::kBFloat16) {
    return "queries must be float16 or bfloat16";
  }
  if (p.query_start_loc != nullptr) return "decode only";
  if (p.num_blocks < 1) return "empty cache";
  if (!vec16) return "cache rows must be 16-byte aligned";
  BulkDecodeParams bp;
  return plan(p, cache, false, bp);
}

void launch_decode_bulk(const AttnParams& p, DType qdtype, KVCacheDType cache, cudaStream_t s) {
  if (p.num_q == 0) return;
  BulkDecodeParams bp;
  plan(p, cache, true, bp);
  const int esz = bp.row_bytes / p.head_size;
  if (bp.tma && !(encode_cache_map(&bp.k_map, p.k_cache, p.kl, p, esz) &&
                  encode_cache_map(&bp.v_map, p.v_cache, p.vl, p, esz))) {
    plan(p, cache, false, bp);  // the driver refused the maps: row copies
  }
  // Balanced mode: one row per work item of the plan, one partition (decode_plan.h).
  const bool planned = p.work_items != nullptr;
  const int parts = !planned && p.partition_size > 0 ? p.max_parts : 1;
  const unsigned rows = planned ? p.plan_items : p.num_q;
  const unsigned heads = p.num_kv_heads * bp.gchunks;
  const dim3 grid = bp.heads_first ? dim3(heads, rows, parts) : dim3(rows, heads, parts);
  const int smem = smem_bytes(bp);
  const int fp8 = fp8_kind(cache);
  const uint64_t ctas = uint64_t(grid.x) * grid.y * grid.z;
  bp.timeline = decode_timeline_buffer(ctas, s);
  if (qdtype == DType::kFloat16) {
    launch_decode_bulk_f16(bp, fp8, grid, smem, s);
  } else {
    launch_decode_bulk_bf16(bp, fp8, grid, smem, s);
  }
  decode_timeline_dump(bp.timeline, ctas, s);
}

}  // namespace pagedkv::cuda_ops
