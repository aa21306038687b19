// fp8 caches in the Hopper wgmma prefill (prefill_wgmma_kernel.cuh): where a cached group's raw
// bytes land in a stage (raw_offset), how they become the query dtype in place (Fp8Dequant,
// dequant_group), and who does it: the producer for K tiles (dequant_raw), the consumers for V
// tiles under their wgmma (consumer_dequant_group), how many set by WgParams::consumer_dequant.
// Profiled with the producer alone, its four warps were what the consumers waited for: one warp
// per scheduler issuing every dequantisation.
#pragma once

#include <type_traits>

#include "ops/cuda/prefill_wgmma.h"
#include "ops/cuda/prefill_wgmma_tile.cuh"

namespace pagedkv::cuda_ops::prefill_wg {

#if PAGEDKV_WGMMA_ENABLED

// fp8 cache with maps: whether the group of keys [key0, key0 + 16) lies whole in the cached
// context, so that its bytes come as one raw box (issue_raw, dequant_group).
__device__ __forceinline__ bool raw_group(const WgParams& wp, int key0, const CtaWork& w) {
  return wp.raw_tma != 0 && key0 + 16 <= w.ctx;
}

// Where group g's raw bytes land in its tile half: inside the group's own dequantised rows (2 KB
// per 64-column block), where only the group itself will write: its second block for head size
// 128, the second half of its block for 64.
template <int DP>
__device__ __forceinline__ int raw_offset(int g) {
  return (DP == 128 ? Tile<DP>::BN * 128 : 1024) + g * 2048;
}

// fp8 -> T (fp16 / bf16) without conversion instructions (quarter rate on sm_90; the fp32 path
// took four per pair of values, and the extend over an fp8 prefix ran 6 % slower with it on the
// H100). A byte s.e.m moved into a 16-bit lane as s, zeros, e.m (right-aligned under T's exponent
// field) reads as the fp8 value times 2^-(bias of T - bias of fp8), subnormals included (fp16 /
// bf16 arithmetic keeps subnormals), so one multiply by 2^(that difference) makes it exact and a
// second, split into two T (hi + lo, for an fp32-accurate product), applies the scale.
// The fp8 NaN / infinity encodings (e4m3 s.1111.111; e5m2 s.11111.mm) would come out as large
// finite values that way, so a round of bytes is first tested for them (special(): three integer
// operations per 4 bytes) and, where a warp finds any, converted by the instruction instead
// (e5m2 into fp16 needs neither: see `check`).
template <typename T>
struct Fp8Dequant {
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  T2 pow2, hi, lo, factor;
  int shift;   // right shift of the byte's exponent and mantissa bits from the lane's top byte
  bool exact;  // pow2 * scale is a T (scale 1, the engine's): one multiply by `factor` does all
  bool check;  // the format has encodings the shift-and-multiply would turn finite
  bool e5m2;

  static __device__ __forceinline__ T to_zero(float v) {
    if constexpr (std::is_same_v<T, __half>) {
      return __float2half_rz(v);
    } else {
      return __float2bfloat16_rz(v);
    }
  }

  __device__ __forceinline__ Fp8Dequant(int kind, float scale) {
    constexpr bool kHalf = std::is_same_v<T, __half>;
    e5m2 = kind == kE5M2;
    const int bias = e5m2 ? 15 : 7, exp_bits = e5m2 ? 5 : 4;
    shift = (kHalf ? 5 : 8) - exp_bits;
    const float p = exp2f(float((kHalf ? 15 : 127) - bias));
    // Toward zero, so that lo = scale - hi has hi's sign and infinity * hi + infinity * lo is
    // infinity, not NaN. (lo = 0 would make it NaN, but where infinities pass through here, e5m2
    // into fp16, p is 1, so lo = 0 means an exact scale, which takes the one-multiply path.)
    const T h = to_zero(scale);
    pow2 = T2{from_float<T>(p), from_float<T>(p)};
    hi = T2{h, h};
    const T l = from_float<T>(scale - to_float(h));
    lo = T2{l, l};
    const T f = from_float<T>(p * scale);
    factor = T2{f, f};
    exact = to_float(f) == p * scale && isfinite(p * scale);
    // e5m2 into fp16 needs no check: its bytes are the top bytes of the fp16 encodings, and the
    // hi + lo products keep infinity because hi is rounded toward zero (lo has its sign).
    check = !(e5m2 && kHalf);
  }
  // The special encodings per byte: e4m3 e.m = 1111111 (NaN); e5m2 e = 11111 (infinity for
  // m = 0, else NaN). (b & mask) + add has its top bit set iff b is one of them (no carry leaves
  // the byte: the sum is at most 0x80). Selected here, not held: the producer's registers are
  // few.
  __device__ __forceinline__ uint32_t sp_mask() const { return e5m2 ? 0x7c7c7c7cu : 0x7f7f7f7fu; }
  __device__ __forceinline__ uint32_t sp_add() const { return e5m2 ? 0x04040404u : 0x01010101u; }
  // Whether any byte of `w` is a NaN / infinity encoding (nonzero if so).
  __device__ __forceinline__ uint32_t special(uint32_t w) const {
    return ((w & sp_mask()) + sp_add()) & 0x80808080u;
  }
  // Bytes 2i, 2i + 1 of `w` (i = 0, 1) as a pair of T times the scale; kExact: when `exact`.
  // kHardware: by the conversion instruction instead, which keeps NaN / infinity (rare rounds
  // only: the special encodings arrive only if a model wrote NaN or, e5m2, infinity).
  template <bool kExact, bool kHardware = false>
  __device__ __forceinline__ uint32_t pair(uint32_t w, int i) const {
    T2 r;
    if constexpr (kHardware) {
      const uint16_t two = uint16_t(i == 0 ? w : w >> 16);
      const __half2 h(__nv_cvt_fp8x2_to_halfraw2(two, e5m2 ? __NV_E5M2 : __NV_E4M3));  // exact
      if constexpr (std::is_same_v<T, __half>) {
        r = __hfma2(h, hi, __hmul2(h, lo));
      } else {
        const float2 f = __half22float2(h);
        const float sc = to_float(hi.x) + to_float(lo.x);
        r = __floats2bfloat162_rn(f.x * sc, f.y * sc);
      }
      return *reinterpret_cast<const uint32_t*>(&r);
    }
    const uint32_t x = __byte_perm(w, 0u, i == 0 ? 0x1404 : 0x3424);  // bytes to the lanes' tops
    const uint32_t y = ((x & 0x7f007f00u) >> shift) | (x & 0x80008000u);
    const T2 u = *reinterpret_cast<const T2*>(&y);
    if constexpr (kExact) {
      r = __hmul2(u, factor);
    } else {
      const T2 v = __hmul2(u, pow2);  // exact: a power of two
      r = __hfma2(v, hi, __hmul2(v, lo));
    }
    return *reinterpret_cast<const uint32_t*>(&r);
  }
};

// Group g of a tile half, its raw bytes landed, dequantised in place by one warp, kBatch 16-byte
// units per lane at a time. A group's raw bytes lie inside its own rows (raw_offset) and a round
// of the warp's units covers whole rows (32 / (DP / 16) of them), whose raw bytes hold only rows
// of that round or earlier ones, so each round reads its units, syncs the warp, and writes them
// out into the swizzled layout, waiting for no other warp. Rounds of more units give more
// independent work per lane (the producer's) and take more registers (the consumers' are full).
template <typename T, int DP, int kBatch>
__device__ __forceinline__ void dequant_group(uint32_t base, int g, const Fp8Dequant<T>& dq,
                                              int lane) {
  using C = Tile<DP>;
  constexpr int kUnits = DP / 16, kLaneUnits = 16 * kUnits / 32;  // 16-byte units per lane
  static_assert(kLaneUnits % kBatch == 0);
#pragma unroll
  for (int i0 = 0; i0 < kLaneUnits; i0 += kBatch) {
    uint4 raw[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int idx = lane + 32 * (i0 + i), r = idx / kUnits, u = idx % kUnits;
      asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(raw[i].x), "=r"(raw[i].y), "=r"(raw[i].z), "=r"(raw[i].w)
                   : "r"(base + raw_offset<DP>(g) + r * DP + u * 16)
                   : "memory");
    }
    __syncwarp();  // the round's bytes read before they are overwritten
    uint32_t sp = 0;
    if (dq.check) {
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        sp |= dq.special(raw[i].x) | dq.special(raw[i].y) | dq.special(raw[i].z) |
              dq.special(raw[i].w);
      }
    }
    auto write = [&](auto exact, auto hardware) {
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int idx = lane + 32 * (i0 + i), r = idx / kUnits, u = idx % kUnits;
        const uint32_t b[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // bytes 8h .. 8h + 7: 16-byte unit 2u + h of the row
          constexpr bool kExact = decltype(exact)::value, kHw = decltype(hardware)::value;
          asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(
                           base + wgmma::sw128(16 * g + r, 2 * u + h, C::BN)),
                       "r"(dq.template pair<kExact, kHw>(b[2 * h], 0)),
                       "r"(dq.template pair<kExact, kHw>(b[2 * h], 1)),
                       "r"(dq.template pair<kExact, kHw>(b[2 * h + 1], 0)),
                       "r"(dq.template pair<kExact, kHw>(b[2 * h + 1], 1))
                       : "memory");
        }
      }
    };
    // Warp-uniform branches: NaN / infinity bytes are rare (a cache holds them only if a model
    // wrote NaN or, e5m2, infinity), so the round almost always takes one of the first two.
    if (!__any_sync(0xffffffffu, sp != 0)) {
      if (dq.exact) {
        write(std::true_type{}, std::false_type{});
      } else {
        write(std::false_type{}, std::false_type{});
      }
    } else {
      write(std::false_type{}, std::true_type{});
    }
  }
}

// The raw groups of one half of tile kt (landed: the caller waited for the raw mbarrier),
// dequantised by the producer warpgroup, a group per warp at a time. (On the H100 as fast as
// batches spread over the warpgroup behind producer barriers, 555 against 551 us, without their
// spills.)
template <typename T, int DP>
__device__ __forceinline__ void dequant_raw(const WgParams& wp, unsigned char* tile, float scale,
                                            int kt, const CtaWork& w, int ptid) {
  using C = Tile<DP>;
  const Fp8Dequant<T> dq(wp.vf.cache_fp8, scale);
#pragma unroll 1
  for (int g = ptid / 32; g < C::BN / 16; g += 4) {
    if (raw_group(wp, kt + 16 * g, w)) {
      dequant_group<T, DP, DP / 32>(smem_addr(tile), g, dq, ptid & 31);  // one round
    }
  }
}

// Consumers (consumer_dequant): consumer warp cw (0..7, one per 16-key group of the tile) waits
// for the raw bytes of K or V tile kt (phase `parity` of the half's raw mbarrier) and dequantises
// its group with `scale`, while a wgmma of the warpgroup runs. Returns whether the tile has raw
// groups (uniform over the CTA): then every consumer passes the half's named barrier
// (kKReadyBar, kVReadyBar) before a wgmma reads the tile.
template <typename T, int DP>
__device__ __forceinline__ bool consumer_dequant_group(const WgParams& wp, const CtaWork& w,
                                                       uint32_t tile, uint64_t* raw,
                                                       uint32_t parity, int kt, float scale) {
  if (!raw_group(wp, kt, w)) return false;  // the raw groups are a prefix of the tile
  const int cw = threadIdx.x >> 5;
  if (raw_group(wp, kt + 16 * cw, w)) {
    wgmma::mbar_wait(raw, parity);
    dequant_group<T, DP, 1>(tile, cw, Fp8Dequant<T>(wp.vf.cache_fp8, scale), threadIdx.x & 31);
    wgmma::fence_proxy_async();  // the generic stores, visible to the other warps' wgmma
  }
  return true;
}

// Named barriers of the 256 consumer threads: a K / V tile's raw groups are dequantised (ids 1
// and 2 are the consumer warpgroups', 3 and 4 their turns).
constexpr int kKReadyBar = 5, kVReadyBar = 6;

#endif  // PAGEDKV_WGMMA_ENABLED

}  // namespace pagedkv::cuda_ops::prefill_wg
