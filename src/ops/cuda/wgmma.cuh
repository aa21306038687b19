// Hopper (sm_90a) warpgroup MMA helpers: shared-memory matrix descriptors for 128-byte swizzled
// tiles, the wgmma fence / commit / wait protocol, and wgmma.mma_async m64nNk16 with fp32
// accumulators (A from shared memory or from registers, B from shared memory). Only callable from
// code compiled for sm_90a (guard call sites with PAGEDKV_WGMMA_ENABLED).
//
// Accumulator layout (PTX ISA "Matrix Fragments for wgmma.mma_async.m64nNk16"), as float d[N/8][4]:
// warp w of the warpgroup owns rows 16w..16w+15; d[j][e] is row 16w + lane/4 + 8 * (e >> 1),
// column 8j + 2 * (lane % 4) + (e & 1) -- the mma.sync m16n8 C layout repeated N/8 times. The
// register A operand (four .b32, two 16-bit elements each) is the mma.sync m16n8k16 A layout for
// the warp's 16 rows, so the accumulators of columns 16k..16k+15 pack into the A operand of k-step
// k without any shuffle.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ops/cuda/mma.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PAGEDKV_WGMMA_ENABLED 1
#else
#define PAGEDKV_WGMMA_ENABLED 0
#endif

namespace pagedkv::cuda_ops::wgmma {

// Byte address of one 16-byte chunk in a 128-byte swizzled tile stored as [cols / 64][rows][64]
// 16-bit elements: row r, chunk c (elements 8c..8c+7). Each 8-row x 128-byte atom (1024 bytes,
// 1024-aligned) permutes its chunks by XOR with the row index: the layout the hardware expects
// for swizzle mode 128B, and conflict-free for 8 rows written or read at the same chunk.
__host__ __device__ constexpr uint32_t sw128(int r, int c, int rows) {
  return uint32_t((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// Matrix descriptor: start address, leading / stride byte offsets (all >> 4, 14 bits each) and
// swizzle mode 1 (128B) in bits 62-63; base offset 0 (every atom is 1024-aligned).
//  - K-major operand (Q, K: rows along M/N, 64 contiguous K elements per 128-byte row): LBO is
//    unused for swizzled layouts (1 by convention), SBO = 1024 (next 8 rows).
//  - MN-major operand (V as B of P V with the transpose flag: 64 contiguous N elements per row,
//    one row per key): LBO = distance between 64-column blocks, SBO = 1024 (next 8 keys).
// Moving along K inside a 128-byte row adds bytes to the start address (the hardware applies the
// XOR to the final address bits, so +32 bytes selects the next 16 elements of every row).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((saddr & 0x3FFFF) >> 4) | (uint64_t((lbo & 0x3FFFF) >> 4) << 16) |
         (uint64_t((sbo & 0x3FFFF) >> 4) << 32) | (uint64_t(1) << 62);
}
#if PAGEDKV_WGMMA_ENABLED

// Orders this thread's register writes (accumulators, A fragments) before the next wgmma.
__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy writes (cp.async, st.shared) visible to the async proxy (wgmma operand reads).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Pins accumulator registers at this point of the program: the compiler must not move their reads
// or writes across (an in-flight wgmma owns them between issue and wait).
template <int NB>
__device__ __forceinline__ void fence_operand(float (&d)[NB][4]) {
#pragma unroll
  for (int j = 0; j < NB; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}

#define PKV_F4(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define PKV_F16(d, j) PKV_F4(d, j), PKV_F4(d, j + 1), PKV_F4(d, j + 2), PKV_F4(d, j + 3)
#define PKV_ACC32(d) PKV_F16(d, 0), PKV_F16(d, 4)
#define PKV_ACC64(d) PKV_ACC32(d), PKV_F16(d, 8), PKV_F16(d, 12)
#define PKV_D32                                                                                 \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24," \
  "%25,%26,%27,%28,%29,%30,%31}"
#define PKV_D64                                                                                  \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,"  \
  "%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
  "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"

// d (+)= A B, m64n128k16, A and B from shared memory, both K-major. scale_d = 0: d = A B.
#define PKV_SS128(TY)                                                      \
  asm volatile(                                                            \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                         \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " PKV_D64 \
      ", %64, %65, p, 1, 1, 0, 0;\n}\n"                                    \
      : PKV_ACC64(d)                                                       \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d)                             \
      : "memory")
template <typename T>
__device__ __forceinline__ void mma_ss_n128(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b,
                                            int scale_d) {
  if constexpr (std::is_same_v<T, __half>) {
    PKV_SS128("f16");
  } else {
    PKV_SS128("bf16");
  }
}

// d += A B, m64nNk16 (N = 64 or 128), A from registers, B from shared memory N-major
// (transpose flag set: B is stored [k][n] with n contiguous).
#define PKV_RS128(TY)                                                      \
  asm volatile(                                                            \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                         \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " PKV_D64 \
      ", {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"                         \
      : PKV_ACC64(d)                                                       \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1)    \
      : "memory")
#define PKV_RS64(TY)                                                      \
  asm volatile(                                                           \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                        \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " PKV_D32 \
      ", {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"                        \
      : PKV_ACC32(d)                                                      \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1)   \
      : "memory")
template <typename T, int NB>
__device__ __forceinline__ void mma_rs_tn(float (&d)[NB][4], const uint32_t (&a)[4],
                                          uint64_t desc_b) {
  static_assert(NB == 8 || NB == 16, "m64n64 or m64n128");
  constexpr bool f16 = std::is_same_v<T, __half>;
  if constexpr (NB == 16) {
    if constexpr (f16) {
      PKV_RS128("f16");
    } else {
      PKV_RS128("bf16");
    }
  } else {
    if constexpr (f16) {
      PKV_RS64("f16");
    } else {
      PKV_RS64("bf16");
    }
  }
}

#undef PKV_SS128
#undef PKV_RS128
#undef PKV_RS64
#undef PKV_D64
#undef PKV_D32
#undef PKV_ACC64
#undef PKV_ACC32
#undef PKV_F16
#undef PKV_F4

// ---- mbarriers (producer / consumer hand-off of K/V stages) ----------------------------------

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile(
      "{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_addr(bar))
      : "memory");
}
// Arrives on `bar` once all cp.async issued so far by this thread have landed (.noinc: the
// barrier's expected count already includes this arrival).
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar))
               : "memory");
}
// Blocks until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"  // labels are local to the braces: inlining is fine
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// Named barrier over `threads` threads (a warpgroup): leaves the other warpgroups running.
__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives on named barrier `id` (of `threads` threads) without waiting for it.
__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

#endif  // PAGEDKV_WGMMA_ENABLED

}  // namespace pagedkv::cuda_ops::wgmma
