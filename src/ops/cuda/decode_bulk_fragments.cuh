// The Hopper decode's operand fragments (decode_bulk.cuh): a staged chunk's K and V tiles read by
// ldmatrix into mma.sync fragments, and fp8 bytes converted to f16 pairs in registers.
//
// fp8 tiles are read with the same ldmatrix instructions as 16-bit ones (pairs of fp8 bytes as
// one b16 element), so the head dimension of S is permuted within each k step (a dot product does
// not care) and the rows of O^T are permuted and mapped back on the final store (out_dim).
#pragma once

#include "ops/cuda/decode_bulk_stream.cuh"
#include "ops/cuda/mma.cuh"

namespace pagedkv::cuda_ops::bulk_decode {

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

// A lane's ldmatrix.x4 addresses into staged tiles (per-lane constants).
template <typename SH>
struct TileReader {
  StageLayout sl;
  // Matrices (rows 0-7, U), (rows 8-15, U), (rows 0-7, U + 1), (rows 8-15, U + 1): K tiles, and
  // fp8 V; 16-bit V tiles take (rows 0-7, U), (0-7, U + 1), (8-15, U), (8-15, U + 1).
  StageLayout::LdLane lk, lv;

  __device__ __forceinline__ TileReader(const StageLayout& layout, int lane)
      : sl(layout),
        lk(layout.ld_lane((lane & 7) + (lane & 8), lane >> 4)),
        lv(layout.ld_lane((lane & 7) + (lane >> 4) * 8, (lane >> 3) & 1)) {}

  // The i-th ldmatrix.x4 of a K tile: one per k step, or per two with fp8.
  __device__ __forceinline__ void load_k(unsigned char* kt, int i, uint32_t (&w)[4]) const {
    ldmatrix_x4(w, sl.ld_at(kt, lk, 2 * i));
  }
  // The i-th (transposed) one of a V tile.
  __device__ __forceinline__ void load_v(unsigned char* vt, int i, uint32_t (&w)[4]) const {
    if constexpr (SH::kFp8) {
      ldmatrix_x4_trans(w, sl.ld_at(vt, lk, 2 * i));
    } else {
      ldmatrix_x4_trans(w, sl.ld_at(vt, lv, 2 * i));
    }
  }
};

// One staged chunk's K and V fragments. With early release (SH::kEarly, bulk_early_release) they
// all move to registers first (read_all), so the stage can be refilled while the math runs;
// otherwise the math reads the stage as it goes.
template <typename SH>
struct ChunkFragments {
  const TileReader<SH>& rd;
  unsigned char* kt;
  unsigned char* vt;
  uint32_t kfr[SH::kEarly ? SH::NK : 1][4], vfr[SH::kEarly ? SH::NK : 1][4];

  __device__ __forceinline__ ChunkFragments(const TileReader<SH>& reader, unsigned char* k_tile,
                                            unsigned char* v_tile)
      : rd(reader), kt(k_tile), vt(v_tile) {}

  __device__ __forceinline__ void read_all() {
    if constexpr (SH::kEarly) {
#pragma unroll
      for (int i = 0; i < SH::NK; ++i) rd.load_k(kt, i, kfr[i]);
#pragma unroll
      for (int i = 0; i < SH::NK; ++i) rd.load_v(vt, i, vfr[i]);
    }
  }
  __device__ __forceinline__ void k(int i, uint32_t (&w)[4]) const {
    if constexpr (SH::kEarly) {
#pragma unroll
      for (int e = 0; e < 4; ++e) w[e] = kfr[i][e];
    } else {
      rd.load_k(kt, i, w);
    }
  }
  __device__ __forceinline__ void v(int i, uint32_t (&w)[4]) const {
    if constexpr (SH::kEarly) {
#pragma unroll
      for (int e = 0; e < 4; ++e) w[e] = vfr[i][e];
    } else {
      rd.load_v(vt, i, w);
    }
  }
};

}  // namespace pagedkv::cuda_ops::bulk_decode
