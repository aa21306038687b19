// Hopper paged decode (one query per sequence) that streams the KV cache at memory bandwidth:
//  - each of the 4 warps of a CTA owns chunks of 16 keys (w, w + 4, ...) and a private ring of
//    stages in shared memory; lanes 0-15 bulk-copy a chunk's 16 K rows and lanes 16-31 its V rows
//    (one cp.async.bulk each, counted on the stage's mbarrier), so a row costs one instruction
//    instead of address math and a cp.async per 16 bytes per lane (ncu showed the previous kernel,
//    decode_mma.cuh, bound by instruction issue, not by memory);
//  - S^T = K Q^T on mma.sync m16n8k16 with the 16 keys as rows and the query heads of the KV group
//    as the 8 columns (two column tiles for groups of 9..16), the head dimension as the k steps;
//  - an online softmax per head (column) in the log2 domain on the accumulator fragments, whose
//    reference maximum moves only when a logit passes it by a slack (no cross-lane reduction on
//    most chunks); P^T goes from the accumulator layout to the B-operand layout by two movmatrix
//    transposes;
//  - O^T += V^T P^T with head-dimension rows: half the accumulator registers of O = P V for a
//    group of 4 (whose 16-row tiles would be three quarters padding);
//  - fp8 caches stay fp8 in shared memory and convert in registers (fp8x2 -> f16x2 is one
//    instruction) straight into fragments, so the MMAs run in fp16 with the queries scaled by a
//    power of two into fp16's range. The fp8 tiles are read with the same ldmatrix instructions
//    as 16-bit ones (pairs of fp8 bytes as one b16 element), so the head dimension of S is
//    permuted within each k step (a dot product does not care) and the rows of O^T are permuted
//    and mapped back on the final store (out_dim);
//  - the head size is a template parameter (every supported size that is a multiple of 16): no
//    step is guarded by a run-time bound, so the chunk loop is straight-line code whose shared-
//    memory addresses are per-lane constants plus immediates (ncu: a run-time bound made the
//    address arithmetic 60 % of the fp8 kernel's instructions);
//  - where the registers allow (head sizes up to 128, one column tile), a warp reads a chunk's
//    whole K and V tiles into fragments first and refills the stage before the math (early
//    release): a stage then waits for its copy only, not for the copy and the math;
//  - the warps' states merge through shared memory; split mode writes normalised partials with
//    their max logit and exp-sum (vLLM paged_attention_v2).
// Keys outside [k_lo, k_hi) are not copied: their V rows are zeroed (0 * a stale NaN is NaN) and
// their logits masked to -inf.
#pragma once

#include <type_traits>

#include "ops/cuda/bulk_copy.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/decode_bulk.h"
#include "ops/cuda/decode_timeline.h"
#include "ops/cuda/device_props.h"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/split_k.cuh"

namespace pagedkv::cuda_ops::bulk_decode {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kKeys = 16;  // keys per chunk: the 16 rows of S^T, one k step of O^T += V^T P^T
constexpr float kL2e = 1.4426950408889634f;
constexpr float kSlack = 8.f;  // lazy maximum: how far (log2) a logit may exceed the reference

// Two fp8 values (the low, or with HI the high, 16 bits of w) -> one f16x2 register: one cvt, the
// halves addressed as a register pair (no masks or shifts).
template <int KIND, bool HI>
__device__ __forceinline__ uint32_t fp8x2_to_h2(uint32_t w) {
  uint32_t h;
  if constexpr (KIND == kE5M2) {
    if constexpr (HI) {
      asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e5m2x2 %0, h;}"
          : "=r"(h)
          : "r"(w));
    } else {
      asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e5m2x2 %0, l;}"
          : "=r"(h)
          : "r"(w));
    }
  } else {
    if constexpr (HI) {
      asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, h;}"
          : "=r"(h)
          : "r"(w));
    } else {
      asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, l;}"
          : "=r"(h)
          : "r"(w));
    }
  }
  return h;
}

// Head-dimension index of row rr (0..15) of O^T tile mt: a transposed ldmatrix of fp8 V gives a
// lane two neighbouring dims (2 r, 2 r + 1) of its keys, which become rows r and r + 8.
template <bool FP8>
__device__ __forceinline__ int out_dim(int mt, int rr) {
  return FP8 ? 16 * mt + 2 * (rr & 7) + (rr >> 3) : 16 * mt + rr;
}

// The bytes (k 2q . d 2r, k 2q . d 2r+1, k 2q+1 . d 2r, k 2q+1 . d 2r+1) that a transposed ldmatrix
// gives a lane, regrouped into the key pairs of dim 2r (low half) and of dim 2r + 1 (high half).
__device__ __forceinline__ uint32_t key_pairs(uint32_t w) { return __byte_perm(w, 0u, 0x3120); }

// Grid: (num_seqs, num_kv_heads * gchunks, partitions), x and y swapped with heads_first; kThreads
// threads; dynamic shared memory smem_bytes(bp). HD: the head size (p.head_size, a multiple of
// 16); NH: 8-head column tiles.
template <typename QT, int KIND, int HD, int NH>
__global__ void __launch_bounds__(kThreads, bulk_min_ctas(KIND != kNoFp8, HD, NH))
    decode_bulk_kernel(const __grid_constant__ BulkDecodeParams bp) {
#if PAGEDKV_SM90
  constexpr int KD = HD / 16, D = HD;  // 16-wide head-dimension steps
  constexpr int kOutPitch = bulk_out_pitch(HD);
  static_assert(HD % 16 == 0 && (KIND == kNoFp8 || HD % 32 == 0));
  constexpr bool kFp8 = KIND != kNoFp8;
  constexpr bool kEarly = bulk_early_release(HD, NH);
  using CT = std::conditional_t<kFp8, uint8_t, QT>;  // cache element
  using MT = std::conditional_t<kFp8, __half, QT>;   // MMA operand
  constexpr int NR = 8 * NH;                         // query heads (S^T columns) per CTA
  constexpr bool kQRegs = KD * NH <= 16;             // query fragments live in registers
  const AttnParams& p = bp.a;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // Rings first, from a 1024-byte boundary (the swizzle pattern follows address bits 7..9), then
  // the query tile and the mbarriers.
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  unsigned char* qbase = smem + kWarps * bp.warp_bytes;
  __shared__ float sm_m[kWarps][NR], sm_l[kWarps][NR];
  __shared__ float sm_wmax[kWarps];  // fp8: each warp's largest |query|

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = lane >> 2, q = lane & 3;  // fragment row / column pair of this lane
  const int rs = bp.row_stride, swz = bp.swz;
  const int seq = bp.heads_first ? blockIdx.y : blockIdx.x;
  const int hc = bp.heads_first ? blockIdx.x : blockIdx.y;  // KV head x head chunk
  const int kvh = hc / bp.gchunks;
  const int g0 = (hc % bp.gchunks) * NR;
  const int ng = min(NR, p.group - g0);
  const int part = blockIdx.z;
  Timeline tl;  // profiling builds only (decode_timeline.h)
  tl.stamp(kEntry);

  const int S = bp.stages;
  // What reads nothing an earlier kernel writes runs before the programmatic wait, under that
  // kernel's tail: each warp's ring barriers, and the tensor maps' descriptor fetch.
  uint64_t* bars = reinterpret_cast<uint64_t*>(qbase + bp.q_bytes) + warp * kBulkMaxStages;
  if (lane == 0) {
    for (int i = 0; i < S; ++i) mbar_init(bars + i, 1);
  }
  mbar_init_fence();
  __syncwarp();  // the warp's barriers are initialised before its lanes copy
  if (bp.tma && threadIdx.x == 0) {
    prefetch_tensormap(&bp.k_map);
    prefetch_tensormap(&bp.v_map);
  }
  // Launched as a programmatic dependent (decode_pdl): the previous kernel's writes (the query,
  // the cache, the block tables) are visible only after this.
  pdl_wait();
  tl.stamp(kAfterWait);
  const int* bt = p.block_tables + int64_t(seq) * p.bt_stride;
  auto block_of = [&](int tok) {  // the table entry of key tok, clamped into the table's row
    const int bi = p.bs_shift >= 0 ? tok >> p.bs_shift : tok / p.block_size;
    return bt[min(bi, p.max_blocks - 1)];
  };
  // The key whose block a lane's copies of chunk c read: key c * 16 + lane % 16 (row copies:
  // lanes l and l + 16 copy its K and V rows), or the chunk's first key at or after lo (tensor
  // copies: the chunk's keys share one block).
  auto key_of = [&](int c, int lo) {
    return bp.tma ? max(c * kKeys, lo) : c * kKeys + (lane & 15);
  };
  // Without a sliding window a partition's first key does not depend on the sequence's length,
  // so the block ids of the warp's first S chunks load together with seq_lens: one load latency
  // before the first copies instead of two. Ids of keys past the end are loaded too; their rows
  // are copied (the issue clamps ids into the cache) and masked like any key out of range.
  int first[kBulkMaxStages];
  const bool early = p.window <= 0;
  if (early) {
    const int lo = p.partition_size > 0 ? part * p.partition_size : 0;
#pragma unroll
    for (int j = 0; j < kBulkMaxStages; ++j) {
      first[j] = j < S ? block_of(key_of(lo / kKeys + warp + kWarps * j, lo)) : 0;
    }
  }
  const int q_pos = p.seq_lens[seq] - 1;
  int k_lo, k_hi;
  if (!key_range(p, q_pos, part, k_lo, k_hi)) return;

  // ---- this warp's chunks: cl + warp, cl + warp + kWarps, ... < ch ----
  const int cl = k_lo / kKeys, ch = (k_hi + kKeys - 1) / kKeys;
  const int n = (k_lo < k_hi && cl + warp < ch) ? (ch - cl - warp + kWarps - 1) / kWarps : 0;
  auto chunk = [&](int j) { return cl + warp + kWarps * j; };
  auto valid = [&](int tok) { return tok >= k_lo && tok < k_hi; };

  unsigned char* ring = smem + warp * bp.warp_bytes;
  const CT* kc = static_cast<const CT*>(p.k_cache) + int64_t(kvh) * p.kl.s_head;
  const CT* vc = static_cast<const CT*>(p.v_cache) + int64_t(kvh) * p.vl.s_head;
  auto slot_of = [&](int tok) {
    return p.bs_shift >= 0 ? tok & (p.block_size - 1) : tok % p.block_size;
  };
  // Block id of chunk c's key (key_of); 0 outside the range (a row of block 0 is copied and
  // ignored). The id is loaded a chunk ahead of its copies and checked only when they are issued
  // (issue: bad ids read block 0, never wild memory): a check here would wait for the load at
  // once, and ncu showed that wait as the fp8 kernel's top stall.
  auto lookup = [&](int c) {
    const int tok = key_of(c, k_lo);
    return valid(tok) ? block_of(tok) : 0;
  };
  // The copies carry an L2 evict-first policy: the rows are read once and should not push what is
  // read again (queries, block tables, other CTAs' rows) out of L2 (1-7 % faster, RESULTS.md).
  const uint64_t policy = make_evict_first_policy();
  // Every copy lands whole (keys outside the range too: compute zeroes their V rows), so a stage
  // always expects 2 * 16 * row_bytes.
  auto issue = [&](int c, int stage, int looked_up) {
    const int blk = unsigned(looked_up) < unsigned(p.num_blocks) ? looked_up : 0;
    unsigned char* st = ring + stage * bp.stage_bytes;
    uint64_t* bar = bars + stage;
    if (lane == 0) mbar_arrive_expect(bar, 32u * bp.row_bytes);
    const int key0 = c * kKeys;
    if (bp.tma) {
      const int slices = bp.row_bytes / 128, box_elems = 128 / int(sizeof(CT));
      if (lane < 2 * slices) {  // lane: K slices, then V slices
        const bool is_v = lane >= slices;
        const int h = is_v ? lane - slices : lane;
        tma_load_4d(st + (is_v ? bp.v_off : 0) + h * bp.box_bytes, is_v ? &bp.v_map : &bp.k_map,
                    h * box_elems, kvh, slot_of(key0), blk, bar, policy, true);
      }
    } else {
      const int64_t slot = slot_of(key0 + (lane & 15));
      const CT* src = lane < 16 ? kc + int64_t(blk) * p.kl.s_block + slot * p.kl.s_slot
                                : vc + int64_t(blk) * p.vl.s_block + slot * p.vl.s_slot;
      unsigned char* dst = st + (lane < 16 ? 0 : bp.v_off) + (lane & 15) * rs;
      bulk_copy_g2s_hint(dst, src, bp.row_bytes, bar, policy);
    }
  };
  // Byte of (row j, 16-byte unit u) of a staged K or V tile (BulkDecodeParams).
  auto at = [&](unsigned char* tile, int j, int u) -> unsigned char* {
    return tile + (u >> 3) * bp.box_bytes + j * rs + (((u & 7) ^ (j & swz)) << 4);
  };
  // The row a lane supplies to an ldmatrix.x4: row `row` of unit U + hi for an even unit U (a
  // constant once unrolled). at(tile, row, U + hi) is then the per-lane base plus
  // (U / 8) box_bytes + ((U % 8) * 16 ^ x), which is all the chunk loop computes per ldmatrix.
  struct LdLane {
    int base, x;
  };
  auto ld_lane = [&](int row, int hi) { return LdLane{row * rs, (hi ^ (row & swz)) << 4}; };
  // Matrices (rows 0-7, U), (rows 8-15, U), (rows 0-7, U + 1), (rows 8-15, U + 1): K tiles, and
  // fp8 V; 16-bit V tiles take (rows 0-7, U), (0-7, U + 1), (8-15, U), (8-15, U + 1).
  const LdLane lk = ld_lane((lane & 7) + (lane & 8), lane >> 4);
  const LdLane lv = ld_lane((lane & 7) + (lane >> 4) * 8, (lane >> 3) & 1);
  auto ld_at = [&](unsigned char* tile, const LdLane& l, int u) -> unsigned char* {
    return tile + l.base + (u >> 3) * bp.box_bytes + (((u & 7) << 4) ^ l.x);
  };
  // Zeroes the V rows of keys outside the range in an edge chunk (0 * a stale NaN would be NaN).
  auto clear_edge = [&](unsigned char* vt, int key0) {
    const int j = lane & 15, half = bp.row_bytes / 2;
    if (!valid(key0 + j)) {
      for (int b = (lane >> 4) * half; b < (lane >> 4) * half + half; b += 16) {
        // Whole 16-byte units of row j: the swizzle only permutes units within the row.
        *reinterpret_cast<uint4*>(at(vt, j, b >> 4)) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    fence_proxy_async();  // before a later copy rewrites these bytes
    __syncwarp();
  };

  // ---- each warp's first copies: they need no query, so the KV fetch starts before the query
  //      tile is loaded (hides that load's latency). The first S block ids load together
  //      (unrolled: they stay in registers), so the copies wait for one load latency, not S ----
  if (!early) {
#pragma unroll
    for (int j = 0; j < kBulkMaxStages; ++j) first[j] = j < S && j < n ? lookup(chunk(j)) : 0;
  }
#pragma unroll
  for (int j = 0; j < kBulkMaxStages; ++j) {
    if (j < S && j < n) issue(chunk(j), j, first[j]);
  }
  int nblk = S < n ? lookup(chunk(S)) : 0;

  // ---- the query tile [NR][D + 8] (MT); rows g >= ng are zeros ----
  const int qp = D + 8;
  MT* qs = reinterpret_cast<MT*>(qbase);
  const QT* qg = static_cast<const QT*>(p.q) + int64_t(seq) * p.q_s_tok;
  // Element idx = threadIdx.x + k * kThreads of the tile, all loaded at once (one load latency).
  constexpr int kQPer = NR * D / kThreads;
  static_assert(NR * D % kThreads == 0);
  float qv[kQPer];
#pragma unroll
  for (int k = 0; k < kQPer; ++k) {
    const int idx = threadIdx.x + k * kThreads, g = idx / D, d = idx - g * D;
    qv[k] = g < ng ? to_float(qg[int64_t(kvh * p.group + g0 + g) * p.q_s_head + d]) : 0.f;
  }
  // fp8: the fp16 MMAs see the queries times 2^e, with |q| * 2^e in [2^14, 2^15) (exact; a bf16
  // query may lie outside fp16's range), and the logits are scaled back by 2^-e.
  float qmul = 1.f;
  if constexpr (kFp8) {
    float a = 0.f;
#pragma unroll
    for (int k = 0; k < kQPer; ++k) a = fmaxf(a, fabsf(qv[k]));
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    if (lane == 0) sm_wmax[warp] = a;
    __syncthreads();
    float amax = sm_wmax[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) amax = fmaxf(amax, sm_wmax[w]);
    if (amax > 0.f && amax <= 3.0e38f) {
      int ex = 0;
      frexpf(amax, &ex);
      qmul = ldexpf(1.f, min(max(15 - ex, -120), 120));
    }
  }
#pragma unroll
  for (int k = 0; k < kQPer; ++k) {
    const int idx = threadIdx.x + k * kThreads, g = idx / D, d = idx - g * D;
    qs[g * qp + d] = from_float<MT>(qv[k] * qmul);
  }
  __syncthreads();  // the query tile is complete

  // B fragment i of k step ks, column tile nh: head nh * 8 + r at logical k 2q, 2q + 1 (i = 0) and
  // 2q + 8, 2q + 9 (i = 1); with fp8 those are dims 4q..4q+3 of the step (see the K fragments).
  auto qfrag = [&](int ks, int nh, int i) -> uint32_t {
    const MT* row = qs + (nh * 8 + r) * qp + ks * 16;
    return *reinterpret_cast<const uint32_t*>(row + (kFp8 ? 4 * q + 2 * i : 2 * q + 8 * i));
  };
  uint32_t qf[kQRegs ? KD : 1][NH][2];
  if constexpr (kQRegs) {
#pragma unroll
    for (int ks = 0; ks < KD; ++ks) {
#pragma unroll
      for (int nh = 0; nh < NH; ++nh) {
        qf[ks][nh][0] = qfrag(ks, nh, 0);
        qf[ks][nh][1] = qfrag(ks, nh, 1);
      }
    }
  }

  // Logit constants and this lane's heads: nh * 8 + 2q + i.
  const float kmul = p.qk_scale * p.k_scale.get() / qmul;
  const bool capped = p.softcap > 0.f;
  const float c_in = capped ? kmul / p.softcap : 0.f;
  const float c_out = capped ? p.softcap * kL2e : kmul * kL2e;
  const bool has_alibi = p.alibi != nullptr;
  float slope[NH][2];
#pragma unroll
  for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int g = nh * 8 + 2 * q + i;
      slope[nh][i] = (has_alibi && g < ng) ? p.alibi[kvh * p.group + g0 + g] * kL2e : 0.f;
    }
  }

  float m[NH][2], l[NH][2], tmax[NH][2];  // tmax: the lane's true maximum logit (lazy m)
  float o[KD][NH][4];
#pragma unroll
  for (int nh = 0; nh < NH; ++nh) {
    m[nh][0] = m[nh][1] = -INFINITY;
    tmax[nh][0] = tmax[nh][1] = -INFINITY;
    l[nh][0] = l[nh][1] = 0.f;
#pragma unroll
    for (int mt = 0; mt < KD; ++mt) o[mt][nh][0] = o[mt][nh][1] = o[mt][nh][2] = o[mt][nh][3] = 0.f;
  }

  // ldmatrix.x4 per K (or V) tile: one per k step, or per two with fp8 (byte pairs as b16).
  constexpr int NK = kFp8 ? KD / 2 : KD;
  auto load_k = [&](unsigned char* kt, int i, uint32_t (&w)[4]) {
    ldmatrix_x4(w, ld_at(kt, lk, 2 * i));
  };
  auto load_v = [&](unsigned char* vt, int i, uint32_t (&w)[4]) {
    if constexpr (kFp8) {
      ldmatrix_x4_trans(w, ld_at(vt, lk, 2 * i));
    } else {
      ldmatrix_x4_trans(w, ld_at(vt, lv, 2 * i));
    }
  };
  auto compute = [&](int c, int stage, uint32_t parity, auto&& release) {
    unsigned char* kt = ring + stage * bp.stage_bytes;
    unsigned char* vt = kt + bp.v_off;
    const int key0 = c * kKeys;
    const bool edge = key0 < k_lo || key0 + kKeys > k_hi;
    mbar_wait(bars + stage, parity);
    if (c == cl) tl.stamp(kFirstData);  // thread 0: warp 0's first chunk
    if (edge) clear_edge(vt, key0);
    // Early release (bulk_early_release): every fragment of the chunk to registers, then the
    // stage is refilled while the math runs. Otherwise the math reads the stage as it goes and
    // the caller refills it afterwards.
    [[maybe_unused]] uint32_t kfr[kEarly ? NK : 1][4], vfr[kEarly ? NK : 1][4];
    if constexpr (kEarly) {
#pragma unroll
      for (int i = 0; i < NK; ++i) load_k(kt, i, kfr[i]);
#pragma unroll
      for (int i = 0; i < NK; ++i) load_v(vt, i, vfr[i]);
      __syncwarp();  // every lane has read the stage
      release();
    }
    auto k_frag = [&](int i, uint32_t (&w)[4]) {  // the i-th ldmatrix.x4 of the K tile
      if constexpr (kEarly) {
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = kfr[i][e];
      } else {
        load_k(kt, i, w);
      }
    };
    auto v_frag = [&](int i, uint32_t (&w)[4]) {  // the i-th (transposed) one of the V tile
      if constexpr (kEarly) {
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = vfr[i][e];
      } else {
        load_v(vt, i, w);
      }
    };

    // S^T = K Q^T; even and odd k steps accumulate apart (two shorter MMA dependency chains).
    float sa[NH][4], sb[NH][4];
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sa[nh][e] = sb[nh][e] = 0.f;
    }
    auto s_step = [&](int ks, const uint32_t (&a)[4]) {
#pragma unroll
      for (int nh = 0; nh < NH; ++nh) {
        const uint32_t b0 = kQRegs ? qf[kQRegs ? ks : 0][nh][0] : qfrag(ks, nh, 0);
        const uint32_t b1 = kQRegs ? qf[kQRegs ? ks : 0][nh][1] : qfrag(ks, nh, 1);
        mma_16816<MT>((ks & 1) ? sb[nh] : sa[nh], a, b0, b1);
      }
    };
    if constexpr (kFp8) {
      // One ldmatrix serves two k steps: lane (r, q) gets bytes 4q..4q+3 of keys r and r + 8 in
      // units ks and ks + 1, i.e. logical k (2q, 2q+1 | 2q+8, 2q+9) of each step (qfrag).
#pragma unroll
      for (int ks = 0; ks < KD; ks += 2) {
        uint32_t w[4];
        k_frag(ks / 2, w);
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const uint32_t a[4] = {
              fp8x2_to_h2<KIND, false>(w[2 * t]), fp8x2_to_h2<KIND, false>(w[2 * t + 1]),
              fp8x2_to_h2<KIND, true>(w[2 * t]), fp8x2_to_h2<KIND, true>(w[2 * t + 1])};
          s_step(ks + t, a);
        }
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < KD; ++ks) {
        uint32_t a[4];
        k_frag(ks, a);
        s_step(ks, a);
      }
    }

    // Logits in the log2 domain, masked: element e of tile nh is key key0 + r + 8 (e >> 1), head
    // nh * 8 + 2q + (e & 1). Alibi and the range mask are warp-uniform branches.
    float mx[NH][2];
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
      mx[nh][0] = mx[nh][1] = -INFINITY;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = key0 + r + 8 * (e >> 1);
        const float s = sa[nh][e] + sb[nh][e];
        float x = capped ? c_out * tanhf(s * c_in) : s * c_out;
        if (has_alibi) x += slope[nh][e & 1] * float(tok - q_pos);
        if (edge && !valid(tok)) x = -INFINITY;
        sa[nh][e] = x;
        mx[nh][e & 1] = fmaxf(mx[nh][e & 1], x);
      }
    }
    float alpha[NH][2], ms[NH][2];
    bool grew = false;
    // Lazy maximum: the reference m moves only when some logit of the chunk exceeds it by more
    // than kSlack (log2 domain). Below that p = 2^(x - m) <= 2^kSlack, well inside fp16 / bf16
    // and the fp32 sums, so most chunks skip the cross-lane reduction (three dependent shuffles
    // per column). m is then at most kSlack below the true maximum (tmax keeps that, for the
    // split partials' max logits).
    bool over = false;
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        over |= mx[nh][i] > m[nh][i] + kSlack;
        tmax[nh][i] = fmaxf(tmax[nh][i], mx[nh][i]);
      }
    }
    if (__any_sync(0xffffffffu, over)) {
#pragma unroll
      for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float v = mx[nh][i];
          v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
          v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
          v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
          const float mn = fmaxf(m[nh][i], v);
          ms[nh][i] = mn == -INFINITY ? 0.f : mn;  // nothing unmasked yet: keep zeros, no NaN
          alpha[nh][i] = mn == m[nh][i] ? 1.f : fast_exp2(m[nh][i] - ms[nh][i]);
          grew |= mn != m[nh][i];
          m[nh][i] = mn;
        }
      }
    } else {
#pragma unroll
      for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          ms[nh][i] = m[nh][i] == -INFINITY ? 0.f : m[nh][i];
          alpha[nh][i] = 1.f;
        }
      }
    }
    uint32_t pb[NH][2];  // P^T as the B fragments (keys 0-7, 8-15) of each column tile
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
      float sum[2] = {0.f, 0.f};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sa[nh][e] = fast_exp2(sa[nh][e] - ms[nh][e & 1]);
        sum[e & 1] += sa[nh][e];
      }
      l[nh][0] = l[nh][0] * alpha[nh][0] + sum[0];  // lane-partial sums
      l[nh][1] = l[nh][1] * alpha[nh][1] + sum[1];
      pb[nh][0] = movmatrix_trans(pack2<MT>(sa[nh][0], sa[nh][1]));
      pb[nh][1] = movmatrix_trans(pack2<MT>(sa[nh][2], sa[nh][3]));
    }
    // Rescale O only when some head's maximum grew: after the first chunks that is rare.
    if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
      for (int mt = 0; mt < KD; ++mt) {
#pragma unroll
        for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[mt][nh][e] *= alpha[nh][e & 1];
        }
      }
    }

    // O^T += V^T P^T.
    if constexpr (kFp8) {
      // One transposed ldmatrix serves two tiles (units mt, mt + 1): lane (r, q) gets dims 2r,
      // 2r + 1 of keys 2q, 2q+1 (and 2q+8, 2q+9), regrouped into key pairs: rows r, r + 8 of the
      // tile (out_dim).
#pragma unroll
      for (int mt = 0; mt < KD; mt += 2) {
        uint32_t w[4];
        v_frag(mt / 2, w);
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const uint32_t lo = key_pairs(w[2 * t]), hi = key_pairs(w[2 * t + 1]);
          const uint32_t a[4] = {fp8x2_to_h2<KIND, false>(lo), fp8x2_to_h2<KIND, true>(lo),
                                 fp8x2_to_h2<KIND, false>(hi), fp8x2_to_h2<KIND, true>(hi)};
#pragma unroll
          for (int nh = 0; nh < NH; ++nh) mma_16816<MT>(o[mt + t][nh], a, pb[nh][0], pb[nh][1]);
        }
      }
    } else {
#pragma unroll
      for (int mt = 0; mt < KD; ++mt) {
        uint32_t a[4];
        v_frag(mt, a);
#pragma unroll
        for (int nh = 0; nh < NH; ++nh) mma_16816<MT>(o[mt][nh], a, pb[nh][0], pb[nh][1]);
      }
    }
  };

  // ---- the warp's pipeline (its first S chunks are in flight): a stage is refilled once
  //      computed ----
  if (n > 0) {
    int stage = 0;
    uint32_t parity = 0;
    for (int j = 0; j < n; ++j) {
      auto refill = [&] {  // the stage's next chunk, and the block id of the one after
        if (j + S < n) {
          issue(chunk(j + S), stage, nblk);
          nblk = lookup(chunk(j + S + 1));
        }
      };
      compute(chunk(j), stage, parity, refill);
      if constexpr (!kEarly) {
        __syncwarp();  // every lane has read the stage before it is refilled
        refill();
      }
      if (++stage == S) {
        stage = 0;
        parity ^= 1u;
      }
    }
  }

  tl.stamp(kLoopDone);
  pdl_trigger();  // the next kernel (split mode: the reduction) may launch while CTAs finish

  // ---- merge the warps through shared memory (each warp's ring holds its [NR][D] output, rows
  //      kOutPitch floats apart: the lanes of one store, heads 2q and 2q + 1 for q = 0..3, then
  //      hit different banks instead of one) ----
#pragma unroll
  for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l[nh][i] += __shfl_xor_sync(0xffffffffu, l[nh][i], 4);
      l[nh][i] += __shfl_xor_sync(0xffffffffu, l[nh][i], 8);
      l[nh][i] += __shfl_xor_sync(0xffffffffu, l[nh][i], 16);
    }
  }
  float* ow = reinterpret_cast<float*>(ring);
#pragma unroll
  for (int mt = 0; mt < KD; ++mt) {
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int head = nh * 8 + 2 * q + (e & 1);
        ow[head * kOutPitch + out_dim<kFp8>(mt, r + 8 * (e >> 1))] = o[mt][nh][e];
      }
    }
  }
  // Split mode reports each head's true maximum logit (vLLM's max_logits): the lanes' tmax.
  __shared__ float sm_t[kWarps][NR];
  if (p.partition_size > 0) {
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        tmax[nh][i] = fmaxf(tmax[nh][i], __shfl_xor_sync(0xffffffffu, tmax[nh][i], 4));
        tmax[nh][i] = fmaxf(tmax[nh][i], __shfl_xor_sync(0xffffffffu, tmax[nh][i], 8));
        tmax[nh][i] = fmaxf(tmax[nh][i], __shfl_xor_sync(0xffffffffu, tmax[nh][i], 16));
      }
    }
  }
  if (r == 0) {
#pragma unroll
    for (int nh = 0; nh < NH; ++nh) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        sm_m[warp][nh * 8 + 2 * q + i] = m[nh][i];
        sm_l[warp][nh * 8 + 2 * q + i] = l[nh][i];
        sm_t[warp][nh * 8 + 2 * q + i] = tmax[nh][i];
      }
    }
  }
  __syncthreads();

  // Each head's warp weights once (one thread per head), not per output element: the element
  // loop is then four shared-memory vector loads and FMAs per 4 dimensions, and one store.
  __shared__ float sm_a[kWarps][NR], sm_lsum[NR], sm_mmax[NR];
  if (threadIdx.x < ng) {
    const int g = threadIdx.x;
    WarpMerge<kWarps> wm([&](int w) { return sm_m[w][g]; }, [&](int w) { return sm_l[w][g]; });
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sm_a[w][g] = wm.weight(w, p.v_scale.get());
    sm_lsum[g] = wm.L;
    sm_mmax[g] = wm.M;
    if (p.partition_size > 0) {  // the exp-sum restated against the true maximum (lazy m)
      float t = sm_t[0][g];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) t = fmaxf(t, sm_t[w][g]);
      if (t > wm.M) {
        sm_lsum[g] = wm.L * fast_exp2(wm.M - t);
        sm_mmax[g] = t;
      }
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < ng * (D / 4); idx += kThreads) {
    const int g = idx / (D / 4), d = 4 * (idx - g * (D / 4));
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float a = sm_a[w][g];
      const float4 x = *reinterpret_cast<const float4*>(
          reinterpret_cast<const float*>(smem + w * bp.warp_bytes) + g * kOutPitch + d);
      v.x += a * x.x;
      v.y += a * x.y;
      v.z += a * x.z;
      v.w += a * x.w;
    }
    store_merged4<QT>(p, seq, seq, kvh * p.group + g0 + g, part, d, v, sm_lsum[g], sm_mmax[g]);
  }
  tl.write(bp.timeline);
#else
  __trap();  // never launched: the host checks the device and the binary first
#endif
}

template <typename QT, int KIND, int HD, int NH>
void launch_nh(const BulkDecodeParams& bp, dim3 grid, int smem, cudaStream_t s) {
  launch_dependent(decode_bulk_kernel<QT, KIND, HD, NH>, grid, kThreads, smem, s, decode_pdl(),
                   "decode_bulk", bp);
}

// f(kind, head_size) over the supported head sizes the kernel takes (plan(): multiples of 16, of
// 32 with an fp8 cache), as std::integral_constant arguments.
template <int KIND, typename F>
void dispatch_head_size(int head_size, F&& f) {
  auto one = [&](auto hd) {
    if constexpr (KIND == kNoFp8 || hd.value % 32 == 0) {
      if (head_size == hd.value) f(std::integral_constant<int, KIND>{}, hd);
    }
  };
  one(std::integral_constant<int, 32>{});
  one(std::integral_constant<int, 64>{});
  one(std::integral_constant<int, 80>{});
  one(std::integral_constant<int, 96>{});
  one(std::integral_constant<int, 112>{});
  one(std::integral_constant<int, 128>{});
  one(std::integral_constant<int, 192>{});
  one(std::integral_constant<int, 256>{});
}

template <typename QT>
void launch_typed(const BulkDecodeParams& bp, int cache_fp8, dim3 grid, int smem, cudaStream_t s) {
  auto launch = [&](auto kind, auto hd) {
    if (bp.head_tiles == 1) {
      launch_nh<QT, kind.value, hd.value, 1>(bp, grid, smem, s);
    } else {
      launch_nh<QT, kind.value, hd.value, 2>(bp, grid, smem, s);
    }
  };
  if (cache_fp8 == kE4M3) {
    dispatch_head_size<kE4M3>(bp.a.head_size, launch);
  } else if (cache_fp8 == kE5M2) {
    dispatch_head_size<kE5M2>(bp.a.head_size, launch);
  } else {
    dispatch_head_size<kNoFp8>(bp.a.head_size, launch);
  }
}

}  // namespace pagedkv::cuda_ops::bulk_decode
