// Tensor-core paged decode (one query per sequence), meant to run at memory bandwidth:
//  - a CTA serves up to 16 query heads of one KV group: they are the 16 rows of mma.sync
//    m16n8k16 tiles (zero rows pad smaller groups), so each KV byte is read once per group and
//    a key costs a few tensor-core instructions, not per-key shuffles and a replicated softmax;
//  - each of the 4 warps streams its own chunks of 16 keys (chunks w, w + 4, ...) through a
//    private S-stage cp.async ring of 16-byte copies (no CTA barriers in the key loop): K and V
//    rows land as padded tiles (bank-conflict free for ldmatrix); vLLM's [d][slot] values land
//    as a [d][key] tile, which is already the B operand of P·V;
//  - fp8 caches move half the bytes: the ring holds raw fp8 and each lane dequantises the runs
//    it copied into a 16-bit tile (exact: e4m3 / e5m2 fit fp16 and bf16);
//  - per chunk: S = Q·Kᵀ (16 x 16), online softmax in the log2 domain (FlashAttention) on the
//    accumulator fragments, P kept in registers as the A operand of O += P·V;
//  - the warps' states merge through shared memory; split mode writes normalised partials with
//    their max logit and exp-sum (vLLM paged_attention_v2).
// Keys outside [k_lo, k_hi) are zero-filled by the copy (or zeroed after it, for [d][slot]
// runs that straddle the range) and masked to -inf, so stale cache slots (NaN) never leak.
#pragma once

#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/decode_mma.h"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/split_k.cuh"

namespace pagedkv::cuda_ops::mma_decode {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kKeys = 16;  // keys per warp chunk: two n8 tiles of S, one k16 step of P·V
constexpr float kL2e = 1.4426950408889634f;

// 16-byte async copy; writes zeros (and reads nothing) when !ok.
__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(ok ? 16 : 0));
}

// cp.async.wait_group takes an immediate: dispatch the run-time ring depth.
__device__ __forceinline__ void cp_async_wait_n(int n) {
  switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    default: cp_async_wait<7>(); break;
  }
}

// 16 fp8 values -> 16 QT values (two 16-byte words).
template <typename QT, int KIND>
__device__ __forceinline__ void dequant16(const uint4& raw, uint4* out) {
  constexpr __nv_fp8_interpretation_t f = KIND == kE5M2 ? __NV_E5M2 : __NV_E4M3;
  const uint16_t* h = reinterpret_cast<const uint16_t*>(&raw);
  uint32_t w[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const __half2 hv(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(h[i]), f));
    if constexpr (std::is_same_v<QT, __half>) {
      w[i] = *reinterpret_cast<const uint32_t*>(&hv);
    } else {
      const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(hv));
      w[i] = *reinterpret_cast<const uint32_t*>(&b);
    }
  }
  out[0] = make_uint4(w[0], w[1], w[2], w[3]);
  out[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

// CTAs per SM the registers must allow. The loop is issue-bound (ncu on an H100: 2 warps per
// scheduler, 0.4 of them eligible), so head sizes up to 128 trade the query fragments' registers
// (reloaded from shared memory per chunk) for a third CTA; past 128 that would spill.
template <int KD>
constexpr int kMinCtas = KD <= 8 ? 3 : 2;

// Grid: (num_seqs, num_kv_heads * gchunks, partitions); kThreads threads; dynamic shared memory
// q_bytes + kWarps * warp_bytes. KD: 16-wide head-dimension steps provisioned (head_size <= 16 KD).
template <typename QT, int KIND, int KD>
__global__ void __launch_bounds__(kThreads, kMinCtas<KD>)
    decode_mma_kernel(const MmaDecodeParams mp) {
  using CT = std::conditional_t<KIND == kNoFp8, QT, uint8_t>;
  constexpr bool kFp8 = KIND != kNoFp8;
  constexpr int EPR = 16 / static_cast<int>(sizeof(CT));    // elements per 16-byte run
  constexpr int NT = 2 * KD;                                // 8-wide output column tiles
  constexpr int NIK = (kKeys * (KD * 16 / EPR) + 31) / 32;  // key-row runs per lane per chunk
  constexpr int NIV = (KD * 16 * (kKeys / EPR) + 31) / 32;  // [d][slot] runs per lane per chunk
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
  const QT* qg = static_cast<const QT*>(p.q) + int64_t(seq) * p.q_s_tok;
  for (int idx = threadIdx.x; idx < 16 * D; idx += kThreads) {
    const int g = idx / D, d = idx - g * D;
    qs[g * mp.k_pitch + d] =
        g < ng ? qg[int64_t(kvh * p.group + g0 + g) * p.q_s_head + d] : from_float<QT>(0.f);
  }
  __syncthreads();

  // This lane's accumulator rows: r0 = lane / 4 and r0 + 8.
  const int r0 = lane >> 2;
  float slope[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int g = r0 + 8 * i;
    slope[i] = (p.alibi != nullptr && g < ng) ? p.alibi[kvh * p.group + g0 + g] * kL2e : 0.f;
  }
  const float kmul = p.qk_scale * p.k_scale.get();
  const bool capped = p.softcap > 0.f;
  const float c_in = capped ? kmul / p.softcap : 0.f;
  const float c_out = capped ? p.softcap * kL2e : kmul * kL2e;
  const bool has_alibi = p.alibi != nullptr;

  uint32_t qf[KD <= 4 ? KD : 1][4];  // query fragments stay in registers up to D = 64
  if constexpr (KD <= 4) {
#pragma unroll
    for (int ks = 0; ks < KD; ++ks) {
      if (ks * 16 < D)
        ldmatrix_x4(qf[ks], qs + (lane & 15) * mp.k_pitch + ks * 16 + (lane >> 4) * 8);
    }
  }

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;

  // ---- this warp's chunks of kKeys keys: cl + warp, cl + warp + kWarps, ... < ch ----
  const int cl = k_lo / kKeys, ch = (k_hi + kKeys - 1) / kKeys;
  const int n = (k_lo < k_hi && cl + warp < ch) ? (ch - cl - warp + kWarps - 1) / kWarps : 0;
  auto chunk = [&](int j) { return cl + warp + kWarps * j; };

  unsigned char* wbase = smem + mp.q_bytes + warp * mp.warp_bytes;
  const int kt_bytes = 16 * mp.k_pitch * 2;  // 16-bit K tile; the V tile follows it
  const int R = D / EPR;                     // runs per key row
  const int rinv = (65536 + R - 1) / R;      // idx / R as (idx * rinv) >> 16 (idx < 512)
  const CT* kc = static_cast<const CT*>(p.k_cache) + int64_t(kvh) * p.kl.s_head;
  const CT* vc = static_cast<const CT*>(p.v_cache) + int64_t(kvh) * p.vl.s_head;
  const int* bt = p.block_tables + int64_t(seq) * p.bt_stride;
  auto slot_of = [&](int tok) {
    return p.bs_shift >= 0 ? tok & (p.block_size - 1) : tok % p.block_size;
  };
  auto valid = [&](int tok) { return tok >= k_lo && tok < k_hi; };

  // mp.one_block: the 16 keys of a chunk share one block, so a chunk costs one table lookup, one
  // 64-bit base address and a 32-bit offset per run (the host checked that the offsets fit).
  // KD = 16 (head sizes past 128) keeps the general path: the fast one's extra registers spill.
  const bool one_block = KD <= 8 && mp.one_block;
  // Block id of key (chunk c, lane % 16); 0 for keys outside the range (never read). With
  // one_block every lane looks up the chunk's single block (one broadcast load).
  auto lookup = [&](int c) {
    const int tok = c * kKeys + (one_block ? 0 : lane & 15);
    int b = 0;
    if (one_block ? tok < k_hi && tok + kKeys > k_lo : valid(tok)) {
      const int bi = p.bs_shift >= 0 ? tok >> p.bs_shift : tok / p.block_size;
      b = bt[min(bi, p.max_blocks - 1)];
      b = unsigned(b) < unsigned(p.num_blocks) ? b : 0;  // bad ids: no wild reads
    }
    return b;
  };
  // Destinations of a lane's runs (the same mapping copies and dequantises them).
  auto krow_dst = [&](unsigned char* st, bool is_v, int j, int r) -> unsigned char* {
    if constexpr (kFp8) return st + (is_v ? 16 * D : 0) + j * D + r * 16;
    return st + (is_v ? kt_bytes : 0) + (j * (is_v ? mp.v_pitch : mp.k_pitch) + r * EPR) * 2;
  };
  auto vt_dst = [&](unsigned char* st, int d, int h) -> unsigned char* {
    if constexpr (kFp8) return st + 16 * D + d * 16;
    return st + kt_bytes + (d * mp.v_pitch + h * 8) * 2;
  };

  const int ks_slot = int(p.kl.s_slot), vs_slot = int(p.vl.s_slot);
  const int k_run = int(mp.k_run), v_run = int(mp.v_run);
  auto issue_one_block = [&](int key0, unsigned char* st, int blk) {
    const int64_t slot0 = slot_of(key0);
    const CT* kb = kc + int64_t(blk) * p.kl.s_block + slot0 * p.kl.s_slot;
    const CT* vb = vc + int64_t(blk) * p.vl.s_block + slot0 * p.vl.s_slot;
#pragma unroll
    for (int i = 0; i < NIK; ++i) {
      const int idx = i * 32 + lane;
      const int j = min((idx * rinv) >> 16, kKeys - 1), r = idx - j * R;
      if (idx < kKeys * R) {
        const bool ok = valid(key0 + j);
        cp_async16_zfill(krow_dst(st, false, j, r), kb + (j * ks_slot + r * k_run), ok);
        if (!mp.v_trans) {
          cp_async16_zfill(krow_dst(st, true, j, r), vb + (j * vs_slot + r * v_run), ok);
        }
      }
    }
  };

  auto issue = [&](int c, unsigned char* st, int nblk) {
    const int key0 = c * kKeys;
    // Key rows (K, and V unless it is [d][slot]): the one-block path, or this loop, where each
    // run takes its key's block id from the lane that looked it up. (Written as one loop with a
    // guard rather than if / else: that is the form measured on the H100; an if / else compiles
    // to a different register allocation.)
    if (one_block) issue_one_block(key0, st, nblk);
#pragma unroll
    for (int i = 0; i < NIK && !one_block; ++i) {
      const int idx = i * 32 + lane;
      const int j = min((idx * rinv) >> 16, kKeys - 1), r = idx - j * R;
      const int blk = __shfl_sync(0xffffffffu, nblk, j);
      if (idx < kKeys * R) {
        const int tok = key0 + j;
        const bool ok = valid(tok);
        const int slot = slot_of(tok);
        cp_async16_zfill(
            krow_dst(st, false, j, r),
            kc + int64_t(blk) * p.kl.s_block + int64_t(slot) * p.kl.s_slot + r * mp.k_run, ok);
        if (!mp.v_trans) {
          cp_async16_zfill(
              krow_dst(st, true, j, r),
              vc + int64_t(blk) * p.vl.s_block + int64_t(slot) * p.vl.s_slot + r * mp.v_run, ok);
        }
      }
    }
    if (mp.v_trans) {
#pragma unroll
      for (int i = 0; i < NIV; ++i) {  // [d][slot] runs of EPR keys
        const int idx = i * 32 + lane;
        const int d = EPR == 8 ? idx >> 1 : idx, h = EPR == 8 ? idx & 1 : 0;
        const int t0 = key0 + h * EPR;
        const bool ok = t0 + EPR > k_lo && t0 < k_hi;
        const int tk = min(max(t0, k_lo), k_hi - 1);  // a valid key of the run (same block)
        const int blk = __shfl_sync(0xffffffffu, nblk, (tk - key0) & (kKeys - 1));
        if (d < D) {
          cp_async16_zfill(
              vt_dst(st, d, h),
              vc + int64_t(blk) * p.vl.s_block + int64_t(d) * p.vl.s_chunk + slot_of(t0), ok);
        }
      }
    }
  };

  // fp8: dequantise the runs this lane copied into the warp's 16-bit tile.
  unsigned char* tile = wbase + mp.stages * mp.stage_bytes;
  auto dequant = [&](const unsigned char* st) {
    if constexpr (kFp8) {
#pragma unroll
      for (int i = 0; i < NIK; ++i) {
        const int idx = i * 32 + lane;
        const int j = min((idx * rinv) >> 16, kKeys - 1), r = idx - j * R;
        if (idx < kKeys * R) {
          uint4 w[2];
          dequant16<QT, KIND>(*reinterpret_cast<const uint4*>(st + j * D + r * 16), w);
          uint4* kd = reinterpret_cast<uint4*>(tile + (j * mp.k_pitch + r * 16) * 2);
          kd[0] = w[0];
          kd[1] = w[1];
          if (!mp.v_trans) {
            dequant16<QT, KIND>(*reinterpret_cast<const uint4*>(st + 16 * D + j * D + r * 16), w);
            uint4* vd = reinterpret_cast<uint4*>(tile + kt_bytes + (j * mp.v_pitch + r * 16) * 2);
            vd[0] = w[0];
            vd[1] = w[1];
          }
        }
      }
      if (mp.v_trans) {
#pragma unroll
        for (int i = 0; i < NIV; ++i) {
          const int d = i * 32 + lane;
          if (d < D) {
            uint4 w[2];
            dequant16<QT, KIND>(*reinterpret_cast<const uint4*>(st + 16 * D + d * 16), w);
            uint4* vd = reinterpret_cast<uint4*>(tile + kt_bytes + d * mp.v_pitch * 2);
            vd[0] = w[0];
            vd[1] = w[1];
          }
        }
      }
    }
  };

  auto compute = [&](int c, unsigned char* st) {
    const int key0 = c * kKeys;
    if constexpr (kFp8) {
      dequant(st);
      st = tile;
    }
    const QT* kt = reinterpret_cast<const QT*>(st);
    QT* vt = reinterpret_cast<QT*>(st + kt_bytes);
    __syncwarp();  // every lane's runs have landed (and are dequantised)
    if (mp.v_trans && (key0 < k_lo || key0 + kKeys > k_hi)) {
      // [d][slot] runs straddling the range hold stale slots: zero them (0 * NaN is NaN).
      for (int idx = lane; idx < D * kKeys; idx += 32) {
        const int d = idx / kKeys, j = idx % kKeys;
        if (!valid(key0 + j)) vt[d * mp.v_pitch + j] = from_float<QT>(0.f);
      }
      __syncwarp();
    }

    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int ks = 0; ks < KD; ++ks) {
      if (ks * 16 < D) {
        uint32_t b[4];
        ldmatrix_x4(
            b, kt + ((lane & 7) + (lane >> 4) * 8) * mp.k_pitch + ks * 16 + ((lane >> 3) & 1) * 8);
        if constexpr (KD <= 4) {
          mma_16816<QT>(s[0], qf[ks], b[0], b[1]);
          mma_16816<QT>(s[1], qf[ks], b[2], b[3]);
        } else {
          uint32_t a[4];
          ldmatrix_x4(a, qs + (lane & 15) * mp.k_pitch + ks * 16 + (lane >> 4) * 8);
          mma_16816<QT>(s[0], a, b[0], b[1]);
          mma_16816<QT>(s[1], a, b[2], b[3]);
        }
      }
    }

    // Logits in the log2 domain, masked; s[nt][e] is row r0 + 8 * (e >> 1), key
    // key0 + 8 * nt + 2 * (lane % 4) + (e & 1). Alibi and the range mask are warp-uniform
    // branches: most chunks lie inside the range and most models have no alibi.
    const bool edge = key0 < k_lo || key0 + kKeys > k_hi;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = key0 + nt * 8 + 2 * (lane & 3) + (e & 1);
        float x = capped ? c_out * tanhf(s[nt][e] * c_in) : s[nt][e] * c_out;
        if (has_alibi) x += slope[e >> 1] * float(tok - q_pos);
        if (edge && !valid(tok)) x = -INFINITY;
        s[nt][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    }
    float alpha[2], ms[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float mn = fmaxf(m[i], mx[i]);
      ms[i] = mn == -INFINITY ? 0.f : mn;  // nothing unmasked yet: keep zeros, no NaN
      alpha[i] = mn == m[i] ? 1.f : exp2f(m[i] - ms[i]);  // exactly 1: see the lazy rescale
      m[i] = mn;
    }
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - ms[e >> 1]);
        sum[e >> 1] += s[nt][e];
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) l[i] = l[i] * alpha[i] + sum[i];  // lane-partial sums
    // Rescale O only when some row's maximum grew (alpha is exactly 1 otherwise): after the first
    // chunks that is rare, and the rescale is 4 * NT multiplies per lane (the loop is issue-bound).
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        o[nt][0] *= alpha[0];
        o[nt][1] *= alpha[0];
        o[nt][2] *= alpha[1];
        o[nt][3] *= alpha[1];
      }
    }

    // O += P·V: the S fragments of the two key tiles are the A fragment of one k16 step.
    const uint32_t pa[4] = {pack2<QT>(s[0][0], s[0][1]), pack2<QT>(s[0][2], s[0][3]),
                            pack2<QT>(s[1][0], s[1][1]), pack2<QT>(s[1][2], s[1][3])};
#pragma unroll
    for (int np = 0; np < KD; ++np) {
      if (np * 16 < D) {
        uint32_t b[4];
        if (mp.v_trans) {
          ldmatrix_x4(b, vt + (np * 16 + (lane & 7) + (lane >> 4) * 8) * mp.v_pitch +
                             ((lane >> 3) & 1) * 8);
        } else {
          ldmatrix_x4_trans(b, vt + ((lane & 7) + ((lane >> 3) & 1) * 8) * mp.v_pitch + np * 16 +
                                   (lane >> 4) * 8);
        }
        mma_16816<QT>(o[2 * np], pa, b[0], b[1]);
        mma_16816<QT>(o[2 * np + 1], pa, b[2], b[3]);
      }
    }
    __syncwarp();  // the stage (and tile) may be overwritten once every lane has read it
  };

  // ---- the warp's pipeline: S - 1 chunks in flight while one is computed ----
  const int S = mp.stages;
  if (n > 0) {
    int nblk = lookup(chunk(0));
    for (int j = 0; j < S - 1; ++j) {
      if (j < n) {
        issue(chunk(j), wbase + j * mp.stage_bytes, nblk);
        nblk = lookup(chunk(j + 1));
      }
      cp_async_commit();
    }
    int cur = 0;
    for (int j = 0; j < n; ++j) {
      const int ahead = j + S - 1;
      if (ahead < n) {
        const int st = cur == 0 ? S - 1 : cur - 1;  // the stage computed last iteration
        issue(chunk(ahead), wbase + st * mp.stage_bytes, nblk);
        nblk = lookup(chunk(ahead + 1));
      }
      cp_async_commit();
      cp_async_wait_n(S - 1);
      compute(chunk(j), wbase + cur * mp.stage_bytes);
      cur = cur + 1 == S ? 0 : cur + 1;
    }
    cp_async_wait<0>();
  }

  // ---- merge the warps through shared memory (each warp's ring holds its [16][D] output) ----
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
  float* ow = reinterpret_cast<float*>(wbase);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    if (nt * 8 < D) {
      const int col = nt * 8 + 2 * (lane & 3);
      *reinterpret_cast<float2*>(ow + r0 * D + col) = make_float2(o[nt][0], o[nt][1]);
      *reinterpret_cast<float2*>(ow + (r0 + 8) * D + col) = make_float2(o[nt][2], o[nt][3]);
    }
  }
  if ((lane & 3) == 0) {
    sm_m[warp][r0] = m[0];
    sm_m[warp][r0 + 8] = m[1];
    sm_l[warp][r0] = l[0];
    sm_l[warp][r0 + 8] = l[1];
  }
  __syncthreads();

  for (int idx = threadIdx.x; idx < ng * D; idx += kThreads) {
    const int g = idx / D, d = idx - g * D;
    merge_store<QT, kWarps>(
        p, seq, seq, kvh * p.group + g0 + g, part, d, p.v_scale.get(),
        [&](int w) { return sm_m[w][g]; }, [&](int w) { return sm_l[w][g]; },
        [&](int w) {
          return reinterpret_cast<const float*>(smem + mp.q_bytes + w * mp.warp_bytes)[g * D + d];
        });
  }
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
