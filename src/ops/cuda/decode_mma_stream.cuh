// The tensor-core decode's loads (decode_mma.cuh): how one warp copies its 16-key chunks into the
// stages of its private cp.async ring (16-byte copies, zero-filled outside the CTA's keys), and
// how an fp8 chunk is dequantised into the warp's 16-bit tile. K and V rows land as padded tiles
// (bank-conflict free for ldmatrix); vLLM's [d][slot] values land as a [d][key] tile, which is
// already the B operand of P·V.
#pragma once

#include "ops/cuda/decode_mma_shape.cuh"
#include "ops/cuda/mma.cuh"

namespace pagedkv::cuda_ops::mma_decode {

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

// One warp's chunk stream: block ids from the sequence's table row, copies into a ring stage,
// fp8 dequantisation of the runs this lane copied.
template <typename SH>
struct ChunkCopier {
  using QT = typename SH::Q;
  using CT = typename SH::CT;
  static constexpr int EPR = SH::EPR, NIK = SH::NIK, NIV = SH::NIV;
  const MmaDecodeParams& mp;
  int lane, k_lo, k_hi, D;
  const CT* kc;  // the KV head's caches
  const CT* vc;
  const int* bt;        // the sequence's block-table row
  int kt_bytes;         // the 16-bit K tile; the V tile follows it
  int R, rinv;          // runs per key row; idx / R as (idx * rinv) >> 16 (idx < 512)
  bool one_block;       // a chunk's 16 keys share one block (see the constructor)
  int ks_slot, vs_slot, k_run, v_run;
  unsigned char* tile;  // fp8: the warp's dequantised 16-bit K + V tile

  __device__ __forceinline__ ChunkCopier(const MmaDecodeParams& params, int ln, int lo, int hi,
                                         int kvh, int seq, unsigned char* wbase)
      : mp(params), lane(ln), k_lo(lo), k_hi(hi), D(params.a.head_size) {
    const AttnParams& p = mp.a;
    kt_bytes = 16 * mp.k_pitch * 2;
    R = D / EPR;
    rinv = (65536 + R - 1) / R;
    kc = static_cast<const CT*>(p.k_cache) + int64_t(kvh) * p.kl.s_head;
    vc = static_cast<const CT*>(p.v_cache) + int64_t(kvh) * p.vl.s_head;
    bt = p.block_tables + int64_t(seq) * p.bt_stride;
    // mp.one_block: the 16 keys of a chunk share one block, so a chunk costs one table lookup,
    // one 64-bit base address and a 32-bit offset per run (the host checked that the offsets
    // fit). KD = 16 (head sizes past 128) keeps the general path: the fast one's extra registers
    // spill.
    one_block = SH::KD <= 8 && mp.one_block;
    ks_slot = int(p.kl.s_slot);
    vs_slot = int(p.vl.s_slot);
    k_run = int(mp.k_run);
    v_run = int(mp.v_run);
    tile = wbase + mp.stages * mp.stage_bytes;
  }

  __device__ __forceinline__ int slot_of(int tok) const {
    const AttnParams& p = mp.a;
    return p.bs_shift >= 0 ? tok & (p.block_size - 1) : tok % p.block_size;
  }
  __device__ __forceinline__ bool valid(int tok) const { return tok >= k_lo && tok < k_hi; }

  // Block id of key (chunk c, lane % 16); 0 for keys outside the range (never read). With
  // one_block every lane looks up the chunk's single block (one broadcast load).
  __device__ __forceinline__ int lookup(int c) const {
    const AttnParams& p = mp.a;
    const int tok = c * kKeys + (one_block ? 0 : lane & 15);
    int b = 0;
    if (one_block ? tok < k_hi && tok + kKeys > k_lo : valid(tok)) {
      const int bi = p.bs_shift >= 0 ? tok >> p.bs_shift : tok / p.block_size;
      b = bt[min(bi, p.max_blocks - 1)];
      b = unsigned(b) < unsigned(p.num_blocks) ? b : 0;  // bad ids: no wild reads
    }
    return b;
  }

  // Destinations of a lane's runs (the same mapping copies and dequantises them).
  __device__ __forceinline__ unsigned char* krow_dst(unsigned char* st, bool is_v, int j,
                                                     int r) const {
    if constexpr (SH::kFp8) return st + (is_v ? 16 * D : 0) + j * D + r * 16;
    return st + (is_v ? kt_bytes : 0) + (j * (is_v ? mp.v_pitch : mp.k_pitch) + r * EPR) * 2;
  }
  __device__ __forceinline__ unsigned char* vt_dst(unsigned char* st, int d, int h) const {
    if constexpr (SH::kFp8) return st + 16 * D + d * 16;
    return st + kt_bytes + (d * mp.v_pitch + h * 8) * 2;
  }

  __device__ __forceinline__ void issue_one_block(int key0, unsigned char* st, int blk) const {
    const AttnParams& p = mp.a;
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
  }

  // Chunk c's copies into stage st; nblk: this lane's lookup(c).
  __device__ __forceinline__ void issue(int c, unsigned char* st, int nblk) const {
    const AttnParams& p = mp.a;
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
  }

  // fp8: dequantise the runs this lane copied into the warp's 16-bit tile.
  __device__ __forceinline__ void dequant(const unsigned char* st) const {
    if constexpr (SH::kFp8) {
#pragma unroll
      for (int i = 0; i < NIK; ++i) {
        const int idx = i * 32 + lane;
        const int j = min((idx * rinv) >> 16, kKeys - 1), r = idx - j * R;
        if (idx < kKeys * R) {
          uint4 w[2];
          dequant16<QT, SH::kKind>(*reinterpret_cast<const uint4*>(st + j * D + r * 16), w);
          uint4* kd = reinterpret_cast<uint4*>(tile + (j * mp.k_pitch + r * 16) * 2);
          kd[0] = w[0];
          kd[1] = w[1];
          if (!mp.v_trans) {
            dequant16<QT, SH::kKind>(
                *reinterpret_cast<const uint4*>(st + 16 * D + j * D + r * 16), w);
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
            dequant16<QT, SH::kKind>(*reinterpret_cast<const uint4*>(st + 16 * D + d * 16), w);
            uint4* vd = reinterpret_cast<uint4*>(tile + kt_bytes + d * mp.v_pitch * 2);
            vd[0] = w[0];
            vd[1] = w[1];
          }
        }
      }
    }
  }
};

}  // namespace pagedkv::cuda_ops::mma_decode
