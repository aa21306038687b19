// Hopper (sm_90) bulk copies into shared memory and the mbarriers that count their bytes.
//
// One lane's `cp.async.bulk` moves a whole contiguous run (a key's row of K or V) through the
// copy engine, or a whole box of a tensor map (`cp.async.bulk.tensor`: many strided rows, laid
// out swizzled in shared memory), so a warp streams its KV tiles with a few instructions instead
// of a 16-byte cp.async per lane per run; the consumer waits on an mbarrier whose transaction
// count the copies complete. Every helper compiles to nothing below sm_90: callers launch their
// kernels only on devices of compute capability 9.x (and trap otherwise).
#pragma once

#include <cstdint>

#include "ops/cuda/mma.cuh"

namespace pagedkv::cuda_ops {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PAGEDKV_SM90 1
#else
#define PAGEDKV_SM90 0
#endif

// Initialises an mbarrier that completes a phase after `count` arrivals and its expected bytes.
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
#if PAGEDKV_SM90
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
#endif
}

// Makes initialised barriers (generic proxy) visible to the copy engine (async proxy).
__device__ __forceinline__ void mbar_init_fence() {
#if PAGEDKV_SM90
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// One arrival that also announces `bytes` of copies completing on this phase.
__device__ __forceinline__ void mbar_arrive_expect(uint64_t* bar, uint32_t bytes) {
#if PAGEDKV_SM90
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
#endif
}

// Spins until the phase with the given parity (0, 1, 0, ... per use of the barrier) completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if PAGEDKV_SM90
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
#endif
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory
// with an L2 eviction policy (make_evict_first_policy: data read once should not push data read
// again out of L2); completion is counted on `bar`.
__device__ __forceinline__ void bulk_copy_g2s_hint(void* dst, const void* src, uint32_t bytes,
                                                   uint64_t* bar, uint64_t policy) {
#if PAGEDKV_SM90
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;\n" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
#endif
}

__device__ __forceinline__ uint64_t make_evict_first_policy() {
  uint64_t policy = 0;
#if PAGEDKV_SM90
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
#endif
  return policy;
}

// Copies one box of a 4-D tensor map (a __grid_constant__ kernel parameter) at coordinates
// (c0, c1, c2, c3), innermost first, into shared memory laid out as the map's swizzle says;
// completion is counted on `bar`. With `hint`, the copy carries the L2 `policy`.
__device__ __forceinline__ void tma_load_4d(void* dst, const void* map, int c0, int c1, int c2,
                                            int c3, uint64_t* bar, uint64_t policy, bool hint) {
#if PAGEDKV_SM90
  if (hint) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        ".L2::cache_hint [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(smem_addr(dst)),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar)), "l"(policy)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(smem_addr(dst)),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
        : "memory");
  }
#endif
}

// The same for a 3-D tensor map at coordinates (c0, c1, c2), innermost first.
__device__ __forceinline__ void tma_load_3d(void* dst, const void* map, int c0, int c1, int c2,
                                            uint64_t* bar, uint64_t policy, bool hint) {
#if PAGEDKV_SM90
  if (hint) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        ".L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(smem_addr(dst)),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar)), "l"(policy)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(smem_addr(dst)),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
        : "memory");
  }
#endif
}

// Copies one box from shared memory (laid out as the map's swizzle says) to a 3-D tensor map at
// coordinates (c0, c1, c2), innermost first, as a bulk async-group of this thread (bulk_commit,
// bulk_wait_read). Rows outside the tensor are not written.
__device__ __forceinline__ void tma_store_3d(const void* src, const void* map, int c0, int c1,
                                             int c2) {
#if PAGEDKV_SM90
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
          map),
      "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
#endif
}

__device__ __forceinline__ void bulk_commit() {
#if PAGEDKV_SM90
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}

// Waits until this thread's committed bulk stores have read their shared memory (the shared
// memory may then be reused or the CTA exit; the global writes complete by the kernel's end).
__device__ __forceinline__ void bulk_wait_read() {
#if PAGEDKV_SM90
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}

// Programmatic dependent launch (sm_90): lets the next kernel on the stream, launched with the
// programmatic-serialization attribute, start once every CTA of this one got here; that kernel's
// pdl_wait still waits for this one to finish and its writes to be visible, so triggering early
// only hides the launch latency.
__device__ __forceinline__ void pdl_trigger() {
#if PAGEDKV_SM90
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if PAGEDKV_SM90
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Starts fetching a tensor map (a __grid_constant__ kernel parameter) into the descriptor cache,
// so the first copy through it does not wait for that fetch.
__device__ __forceinline__ void prefetch_tensormap(const void* map) {
#if PAGEDKV_SM90
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
#endif
}

// Orders this thread's earlier generic writes to shared memory before later bulk copies into the
// same bytes (they go through the async proxy).
__device__ __forceinline__ void fence_proxy_async() {
#if PAGEDKV_SM90
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

}  // namespace pagedkv::cuda_ops
