// Tensor-core paged decode (one query per sequence), meant to run at memory bandwidth:
//  - a CTA serves up to 16 query heads of one KV group: they are the 16 rows of mma.sync
//    m16n8k16 tiles (zero rows pad smaller groups), so each KV byte is read once per group and
//    a key costs a few tensor-core instructions, not per-key shuffles and a replicated softmax;
//  - load (decode_mma_stream.cuh): each of the 4 warps streams its own chunks of 16 keys
//    (chunks w, w + 4, ...) through a private S-stage cp.async ring of 16-byte copies (no CTA
//    barriers in the key loop); fp8 caches move half the bytes: the ring holds raw fp8 and each
//    lane dequantises the runs it copied into a 16-bit tile (exact: e4m3 / e5m2 fit fp16 and
//    bf16);
//  - scores (decode_mma_query.cuh): S = Q·Kᵀ (16 x 16) per chunk;
//  - softmax state (decode_mma_softmax.cuh): online softmax in the log2 domain (FlashAttention)
//    on the accumulator fragments;
//  - PV and epilogue (decode_mma_pv.cuh): P kept in registers as the A operand of O += P·V; the
//    warps' states merge through shared memory; split mode writes normalised partials with
//    their max logit and exp-sum (vLLM paged_attention_v2).
// Keys outside [k_lo, k_hi) are zero-filled by the copy (or zeroed after it, for [d][slot]
// runs that straddle the range) and masked to -inf, so stale cache slots (NaN) never leak.
#pragma once

#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/decode_mma.h"
#include "ops/cuda/decode_mma_pv.cuh"
#include "ops/cuda/decode_mma_query.cuh"
#include "ops/cuda/decode_mma_softmax.cuh"
#include "ops/cuda/decode_mma_stream.cuh"
#include "ops/cuda/split_k.cuh"

namespace pagedkv::cuda_ops::mma_decode {

// CTAs per SM the registers must allow. The loop is issue-bound (ncu on an H100: 2 warps per
// scheduler, 0.4 of them eligible), so head sizes up to 128 trade the query fragments' registers
// (reloaded from shared memory per chunk) for a third CTA; past 128 that would spill.
template <int KD>
constexpr int kMinCtas = KD <= 8 ? 3 : 2;

// One chunk c of a warp in stage st (its copies landed): fp8 dequantisation, stale [d][slot]
// values zeroed at the range's edges, then scores, softmax state and O.
template <typename SH>
__device__ __forceinline__ void compute_chunk(const ChunkCopier<SH>& cc,
                                              const QueryFragments<SH>& qf, const LogitMap& lm,
                                              SoftmaxState& state, OutAcc<SH>& o, int c,
                                              unsigned char* st) {
  using QT = typename SH::Q;
  const MmaDecodeParams& mp = cc.mp;
  const int lane = cc.lane, D = cc.D, k_lo = cc.k_lo, k_hi = cc.k_hi;
  const int key0 = c * kKeys;
  if constexpr (SH::kFp8) {
    cc.dequant(st);
    st = cc.tile;
  }
  const QT* kt = reinterpret_cast<const QT*>(st);
  QT* vt = reinterpret_cast<QT*>(st + cc.kt_bytes);
  __syncwarp();  // every lane's runs have landed (and are dequantised)
  if (mp.v_trans && (key0 < k_lo || key0 + kKeys > k_hi)) {
    // [d][slot] runs straddling the range hold stale slots: zero them (0 * NaN is NaN).
    for (int idx = lane; idx < D * kKeys; idx += 32) {
      const int d = idx / kKeys, j = idx % kKeys;
      if (!cc.valid(key0 + j)) vt[d * mp.v_pitch + j] = from_float<QT>(0.f);
    }
    __syncwarp();
  }
  float s[2][4];
  chunk_scores(qf, kt, s);
  const bool edge = key0 < k_lo || key0 + kKeys > k_hi;
  float mx[2];
  lm.apply(s, key0, lane, edge, k_lo, k_hi, mx);
  float alpha[2];
  state.update(mx, s, alpha);
  rescale_output<SH>(o, alpha);
  accumulate_pv<SH>(o, s, vt, mp, lane, D);
  __syncwarp();  // the stage (and tile) may be overwritten once every lane has read it
}

// Grid: (num_seqs, num_kv_heads * gchunks, partitions); kThreads threads; dynamic shared memory
// q_bytes + kWarps * warp_bytes. KD: 16-wide head-dimension steps provisioned (head_size <= 16 KD).
template <typename QT, int KIND, int KD>
__global__ void __launch_bounds__(kThreads, kMinCtas<KD>)
    decode_mma_kernel(const MmaDecodeParams mp) {
  using SH = Shape<QT, KIND, KD>;
  const AttnParams& p = mp.a;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float sm_m[kWarps][16], sm_l[kWarps][16];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int D = p.head_size;
  const int seq = blockIdx.x;
  const int kvh = blockIdx.y / mp.gchunks;
  const int g0 = (blockIdx.y % mp.gchunks) * 16;
  const int ng = min(16, p.group - g0);
  const int part = blockIdx.z;

  const int q_pos = p.seq_lens[seq] - 1;
  int k_lo, k_hi;
  if (!key_range(p, q_pos, part, k_lo, k_hi)) return;

  // ---- the query tile [16][k_pitch]: rows g < ng are this CTA's heads, the rest zeros ----
  QT* qs = reinterpret_cast<QT*>(smem);
  load_query_tile<SH>(mp, qs, seq, kvh, g0, ng);
  // This lane's accumulator rows: r0 = lane / 4 and r0 + 8.
  const LogitMap lm(p, kvh, g0, ng, lane >> 2, q_pos);
  const QueryFragments<SH> qf(qs, mp.k_pitch, lane, D);
  SoftmaxState state;
  OutAcc<SH> o;
#pragma unroll
  for (int nt = 0; nt < SH::NT; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;

  // ---- this warp's chunks of kKeys keys: cl + warp, cl + warp + kWarps, ... < ch ----
  const int cl = k_lo / kKeys, ch = (k_hi + kKeys - 1) / kKeys;
  const int n = (k_lo < k_hi && cl + warp < ch) ? (ch - cl - warp + kWarps - 1) / kWarps : 0;
  auto chunk = [&](int j) { return cl + warp + kWarps * j; };
  unsigned char* wbase = smem + mp.q_bytes + warp * mp.warp_bytes;
  const ChunkCopier<SH> cc(mp, lane, k_lo, k_hi, kvh, seq, wbase);

  // ---- the warp's pipeline: S - 1 chunks in flight while one is computed ----
  const int S = mp.stages;
  if (n > 0) {
    int nblk = cc.lookup(chunk(0));
    for (int j = 0; j < S - 1; ++j) {
      if (j < n) {
        cc.issue(chunk(j), wbase + j * mp.stage_bytes, nblk);
        nblk = cc.lookup(chunk(j + 1));
      }
      cp_async_commit();
    }
    int cur = 0;
    for (int j = 0; j < n; ++j) {
      const int ahead = j + S - 1;
      if (ahead < n) {
        const int st = cur == 0 ? S - 1 : cur - 1;  // the stage computed last iteration
        cc.issue(chunk(ahead), wbase + st * mp.stage_bytes, nblk);
        nblk = cc.lookup(chunk(ahead + 1));
      }
      cp_async_commit();
      cp_async_wait_n(S - 1);
      compute_chunk(cc, qf, lm, state, o, chunk(j), wbase + cur * mp.stage_bytes);
      cur = cur + 1 == S ? 0 : cur + 1;
    }
    cp_async_wait<0>();
  }

  // ---- merge the warps through shared memory (each warp's ring holds its [16][D] output) ----
  merge_and_store<SH>(mp, smem, wbase, state, o, sm_m, sm_l, seq, kvh, g0, ng, part);
}

template <typename QT, int KIND, int KD>
void launch_kd(const MmaDecodeParams& mp, dim3 grid, int smem, cudaStream_t s) {
  launch_with_smem(decode_mma_kernel<QT, KIND, KD>, grid, kThreads, smem, s, "decode_mma", mp);
}

template <typename QT>
void launch_typed(const MmaDecodeParams& mp, int cache_fp8, dim3 grid, int smem, cudaStream_t s) {
  dispatch_kind_steps(cache_fp8, mp.a.head_size, [&](auto kind, auto kd) {
    launch_kd<QT, kind.value, kd.value>(mp, grid, smem, s);
  });
}

}  // namespace pagedkv::cuda_ops::mma_decode
