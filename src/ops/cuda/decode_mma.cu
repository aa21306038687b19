// Host side of the tensor-core decode: which calls it covers, the shared-memory plan (tile
// pitches, ring depth) and the launch.
#include <algorithm>

#include "ops/cuda/decode_mma.h"
#include "ops/cuda/device_props.h"

namespace pagedkv::cuda_ops {
namespace {

constexpr int kWarps = 4;
// Shared memory per CTA that lets 3 (or 2) CTAs share an SM; kMinCtas in decode_mma.cuh caps the
// registers so that 3 fit for head sizes up to 128.
constexpr int kBudget3 = 72 * 1024, kBudget2 = 110 * 1024;
// How much faster a full SM streams with 3 resident CTAs than with 2 (H100, decode_variants.py:
// 256 x 512, eight waves, 230 vs 266 us).
constexpr double kSpeed3 = 1.15;
constexpr int kCtaMax = 227 * 1024;  // the sm_90 limit per CTA
int element_bytes(KVCacheDType cache) { return fp8_kind(cache) != kNoFp8 ? 1 : 2; }

// The shared-memory budget, i.e. 2 or 3 CTAs per SM: 3 stream faster, but a grid just past one
// wave of 3-per-SM slots leaves a thin second wave (64 x 2048 = 512 CTAs ran 16 % slower with 3
// per SM than with 2, which fit it in 1.94 waves). Picks the smaller waves x per-wave time.
int cta_budget(int64_t ctas) {
  const int64_t sms = sm_count(current_device());
  auto cost = [&](int per_sm, double speed) {
    return double((ctas + per_sm * sms - 1) / (per_sm * sms)) * per_sm / speed;
  };
  return cost(3, kSpeed3) <= cost(2, 1.0) ? kBudget3 : kBudget2;
}

// Fills everything but `a`; returns why the call is not covered, or nullptr.
const char* plan(const AttnParams& a, KVCacheDType cache, MmaDecodeParams& mp) {
  const int D = a.head_size, esz = element_bytes(cache), epr = 16 / esz;
  mp.a = a;
  mp.gchunks = ceil_div(a.group, 16);
  // Keys: NHD rows (one run of D) or vLLM's [d/x][slot][x] with x = one 16-byte run.
  if (a.kl.whole_rows(D)) {
    mp.k_run = epr;
  } else if (a.kl.x == epr) {
    mp.k_run = a.kl.s_chunk;
  } else {
    return "key_cache rows must be NHD rows or vLLM 16-byte chunks";
  }
  // Values: NHD rows, or vLLM's [d][slot] (runs of epr slots must stay inside one block).
  if (a.vl.whole_rows(D)) {
    mp.v_trans = 0;
    mp.v_run = epr;
  } else if (a.vl.x == 1 && a.vl.s_slot == 1 && a.block_size % epr == 0) {
    mp.v_trans = 1;
    mp.v_run = 0;
  } else {
    return "value_cache rows must be NHD rows, or vLLM columns whose 16-byte runs stay in a block";
  }
  // Offsets of a chunk's runs from its first key: below 16 slots + one row of runs.
  const int64_t k_span = 16 * a.kl.s_slot + (D / epr) * mp.k_run;
  const int64_t v_span = mp.v_trans ? 0 : 16 * a.vl.s_slot + (D / epr) * mp.v_run;
  mp.one_block = a.block_size % 16 == 0 && std::max(k_span, v_span) < (int64_t(1) << 31) &&
                 a.kl.s_slot >= 0 && a.vl.s_slot >= 0;
  mp.k_pitch = D + 8;  // + 16 bytes: ldmatrix rows fall in distinct banks
  mp.v_pitch = mp.v_trans ? 16 + 8 : D + 8;
  const int kt = 16 * mp.k_pitch * 2;
  const int vt = (mp.v_trans ? D : 16) * mp.v_pitch * 2;
  const bool fp8 = esz == 1;
  mp.stage_bytes = fp8 ? 32 * D : kt + vt;
  mp.tile_bytes = fp8 ? kt + vt : 0;
  mp.q_bytes = kt;
  const int64_t ctas =
      int64_t(a.num_q) * a.num_kv_heads * mp.gchunks * (a.partition_size > 0 ? a.max_parts : 1);
  const int budget = cta_budget(ctas);
  const int per_warp = (budget - mp.q_bytes) / kWarps - mp.tile_bytes;
  mp.stages = std::clamp(per_warp / mp.stage_bytes, 2, kMmaMaxStages);
  mp.warp_bytes = std::max(mp.stages * mp.stage_bytes + mp.tile_bytes, 16 * D * 4);
  return mp.q_bytes + kWarps * mp.warp_bytes <= kCtaMax ? nullptr : "the rings do not fit";
}

}  // namespace

const char* decode_mma_uncovered(const AttnParams& p, DType qdtype, KVCacheDType cache,
                                 bool vec16) {
  if (!vec16) return "cache runs must be 16-byte aligned";
  if (qdtype != DType::kFloat16 && qdtype != DType::kBFloat16) {
    return "queries must be float16 or bfloat16";
  }
  if (p.query_start_loc != nullptr) return "decode only";
  if (p.num_blocks < 1) return "empty cache";
  if (p.head_size % 16 != 0 || p.head_size > 256) {
    return "head_size must be a multiple of 16 up to 256";
  }
  MmaDecodeParams mp;
  return plan(p, cache, mp);
}

void launch_decode_mma(const AttnParams& p, DType qdtype, KVCacheDType cache, cudaStream_t s) {
  if (p.num_q == 0) return;
  MmaDecodeParams mp;
  plan(p, cache, mp);
  const int parts = p.partition_size > 0 ? p.max_parts : 1;
  const dim3 grid(p.num_q, p.num_kv_heads * mp.gchunks, parts);
  const int smem = mp.q_bytes + kWarps * mp.warp_bytes;
  const int fp8 = fp8_kind(cache);
  if (qdtype == DType::kFloat16) {
    launch_decode_mma_f16(mp, fp8, grid, smem, s);
  } else {
    launch_decode_mma_bf16(mp, fp8, grid, smem, s);
  }
}

}  // namespace pagedkv::cuda_ops
