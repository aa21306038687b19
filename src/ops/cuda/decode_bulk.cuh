// Hopper paged decode (one query per sequence) that streams the KV cache at memory bandwidth.
// The kernel below composes named steps, one file each:
//  - load (decode_bulk_stream.cuh): each of the 4 warps of a CTA owns chunks of 16 keys (w, w + 4,
//    ...) and a private ring of stages in shared memory, filled by bulk or TMA copies counted on
//    the stages' mbarriers, so a row (or a 16-row box) costs one instruction instead of address
//    math and a cp.async per 16 bytes per lane (ncu showed the previous kernel, decode_mma.cuh,
//    bound by instruction issue, not by memory);
//  - query (decode_bulk_query.cuh): the query tile and its B fragments;
//  - scores (decode_bulk_scores.cuh): S^T = K Q^T on mma.sync m16n8k16 with the 16 keys as rows
//    and the query heads of the KV group as the 8 columns (two column tiles for groups of 9..16),
//    fp8 keys converted in registers (decode_bulk_fragments.cuh);
//  - softmax state (decode_bulk_softmax.cuh): an online softmax per head in the log2 domain on
//    the accumulator fragments, whose reference maximum moves only when a logit passes it by a
//    slack (no cross-lane reduction on most chunks);
//  - PV (decode_bulk_pv.cuh): O^T += V^T P^T with head-dimension rows;
//  - epilogue (decode_bulk_epilogue.cuh): the warps' states merge through shared memory; split
//    mode writes normalised partials with their max logit and exp-sum (vLLM paged_attention_v2).
// The head size is a template parameter (every supported size that is a multiple of 16): no step
// is guarded by a run-time bound, so the chunk loop is straight-line code whose shared-memory
// addresses are per-lane constants plus immediates (ncu: a run-time bound made the address
// arithmetic 60 % of the fp8 kernel's instructions). Where the registers allow (head sizes up to
// 128, one column tile), a warp reads a chunk's whole K and V tiles into fragments first and
// refills the stage before the math (early release): a stage then waits for its copy only, not
// for the copy and the math.
// Keys outside [k_lo, k_hi) are not copied: their V rows are zeroed (0 * a stale NaN is NaN) and
// their logits masked to -inf.
#pragma once

#include <type_traits>

#include "ops/cuda/bulk_copy.cuh"
#include "ops/cuda/decode_bulk_epilogue.cuh"
#include "ops/cuda/decode_bulk_scores.cuh"
#include "ops/cuda/decode_timeline.h"
#include "ops/cuda/device_props.h"

namespace pagedkv::cuda_ops::bulk_decode {

// One chunk c of a warp, in stage `stage` (whose copies complete phase `parity`): wait for its
// copies, clear an edge chunk's stale V rows, then scores, softmax state and O. With early
// release the chunk's fragments move to registers first and release() refills the stage before
// the math; otherwise the caller refills it after.
template <typename SH, typename Release>
__device__ __forceinline__ void compute_chunk(const ChunkStream<SH>& cs, const TileReader<SH>& rd,
                                              const QueryFragments<SH>& qf,
                                              const LogitMap<SH::kNH>& lm, SoftmaxState<SH>& st,
                                              OutAcc<SH>& o, int c, int stage, uint32_t parity,
                                              bool first, Timeline& tl, Release&& release) {
  constexpr int NH = SH::kNH;
  unsigned char* kt = cs.stage(stage);
  unsigned char* vt = kt + cs.bp.v_off;
  const int key0 = c * kKeys;
  const bool edge = key0 < cs.k_lo || key0 + kKeys > cs.k_hi;
  mbar_wait(cs.bars + stage, parity);
  if (first) tl.stamp(kFirstData);  // thread 0: warp 0's first chunk
  if (edge) cs.clear_edge(vt, key0);
  ChunkFragments<SH> frags(rd, kt, vt);
  if constexpr (SH::kEarly) {
    frags.read_all();
    __syncwarp();  // every lane has read the stage
    release();
  }
  float sa[NH][4], sb[NH][4];
  chunk_scores(frags, qf, sa, sb);
  float mx[NH][2];
  lm.apply(sa, sb, key0, cs.lane >> 2, edge, cs.k_lo, cs.k_hi, mx);
  float alpha[NH][2], ms[NH][2];
  const bool grew = st.rescale(mx, alpha, ms);
  uint32_t pb[NH][2];
  st.probabilities(sa, ms, alpha, pb);
  rescale_output<SH>(o, alpha, grew);
  accumulate_pv(o, frags, pb);
}

// Grid: (num_seqs, num_kv_heads * gchunks, partitions), x and y swapped with heads_first (balanced
// mode: the plan's items in place of the sequences, one partition); kThreads
// threads; dynamic shared memory smem_bytes(bp). HD: the head size (p.head_size, a multiple of
// 16); NH: 8-head column tiles.
template <typename QT, int KIND, int HD, int NH>
__global__ void __launch_bounds__(kThreads, bulk_min_ctas(KIND != kNoFp8, HD, NH))
    decode_bulk_kernel(const __grid_constant__ BulkDecodeParams bp) {
#if PAGEDKV_SM90
  using SH = Shape<QT, KIND, HD, NH>;
  using MT = typename SH::MT;
  const AttnParams& p = bp.a;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // Rings first, from a 1024-byte boundary (the swizzle pattern follows address bits 7..9), then
  // the query tile and the mbarriers.
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  unsigned char* qbase = smem + kWarps * bp.warp_bytes;
  __shared__ MergeShared<SH::NR> sh;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const StageLayout sl{bp, bp.row_stride, bp.swz};
  int row = bp.heads_first ? blockIdx.y : blockIdx.x;       // the sequence, or a balanced item
  const int hc = bp.heads_first ? blockIdx.x : blockIdx.y;  // KV head x head chunk
  const int kvh = hc / bp.gchunks;
  const int g0 = (hc % bp.gchunks) * SH::NR;
  const int ng = min(SH::NR, p.group - g0);
  int part = blockIdx.z;
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
  // the cache, the block tables, a scale array) are visible only after this.
  pdl_wait();
  tl.stamp(kAfterWait);
  // Balanced mode: the grid row is a work item of the plan (its sequence and keys), whose partial
  // goes to the item's workspace row (max_parts = 1, part 0).
  int seq = row, item_lo = 0, item_hi = 0;
  const bool planned = p.work_items != nullptr;
  if (planned) {
    if (!plan_item(p, row, seq, item_lo, item_hi, row)) return;
    part = 0;
  }
  const BlockIds ids{bp, p.block_tables + int64_t(seq) * p.bt_stride, lane};
  // Without a sliding window a partition's first key does not depend on the sequence's length,
  // so the block ids of the warp's first S chunks load together with seq_lens: one load latency
  // before the first copies instead of two. Ids of keys past the end are loaded too; their rows
  // are copied (the issue clamps ids into the cache) and masked like any key out of range.
  int first[kBulkMaxStages];
  const bool early = p.window <= 0;
  if (early) {
    const int lo = planned ? item_lo : p.partition_size > 0 ? part * p.partition_size : 0;
#pragma unroll
    for (int j = 0; j < kBulkMaxStages; ++j) {
      first[j] = j < S ? ids.block_of(ids.key_of(lo / kKeys + warp + kWarps * j, lo)) : 0;
    }
  }
  const int q_pos = p.seq_lens[seq] - 1;
  int k_lo = item_lo, k_hi = item_hi;
  if (planned) {
    plan_key_range(p, q_pos, k_lo, k_hi);
  } else if (!key_range(p, q_pos, part, k_lo, k_hi)) {
    return;
  }

  // ---- this warp's chunks: cl + warp, cl + warp + kWarps, ... < ch ----
  const int cl = k_lo / kKeys, ch = (k_hi + kKeys - 1) / kKeys;
  const int n = (k_lo < k_hi && cl + warp < ch) ? (ch - cl - warp + kWarps - 1) / kWarps : 0;
  auto chunk = [&](int j) { return cl + warp + kWarps * j; };
  const ChunkStream<SH> cs(ids, sl, kvh, k_lo, k_hi, bars, smem + warp * bp.warp_bytes);
  const TileReader<SH> rd(cs.layout(), lane);

  // ---- each warp's first copies: they need no query, so the KV fetch starts before the query
  //      tile is loaded (hides that load's latency). The first S block ids load together
  //      (unrolled: they stay in registers), so the copies wait for one load latency, not S ----
  if (!early) {
#pragma unroll
    for (int j = 0; j < kBulkMaxStages; ++j) first[j] = j < S && j < n ? cs.lookup(chunk(j)) : 0;
  }
#pragma unroll
  for (int j = 0; j < kBulkMaxStages; ++j) {
    if (j < S && j < n) cs.issue(chunk(j), j, first[j]);
  }
  int nblk = S < n ? cs.lookup(chunk(S)) : 0;

  // ---- the query tile, the logit map and the running state ----
  MT* qs = reinterpret_cast<MT*>(qbase);
  const float qmul = load_query_tile<SH>(p, qs, seq, kvh, g0, ng, sh.wmax);
  const QueryFragments<SH> qf(qs, lane);
  const LogitMap<NH> lm(p, qmul, kvh, g0, ng, lane & 3, q_pos);
  SoftmaxState<SH> st;
  OutAcc<SH> o;
  zero_output<SH>(o);

  // ---- the warp's pipeline (its first S chunks are in flight): a stage is refilled once
  //      computed ----
  if (n > 0) {
    int stage = 0;
    uint32_t parity = 0;
    for (int j = 0; j < n; ++j) {
      auto refill = [&] {  // the stage's next chunk, and the block id of the one after
        if (j + S < n) {
          cs.issue(chunk(j + S), stage, nblk);
          nblk = cs.lookup(chunk(j + S + 1));
        }
      };
      compute_chunk(cs, rd, qf, lm, st, o, chunk(j), stage, parity, chunk(j) == cl, tl, refill);
      if constexpr (!SH::kEarly) {
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
  merge_and_store<SH>(bp, smem, cs.ring, st, o, sh, row, kvh, g0, ng, part);
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
