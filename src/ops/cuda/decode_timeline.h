// Per-CTA timelines of the Hopper decode, for profiling builds (CMake option
// PAGEDKV_DECODE_TIMELINE): thread 0 of every CTA stamps the GPU's global timer (ns) at its
// entry, after the programmatic wait, when warp 0's first stage has landed, when warp 0's loop is
// done and when the CTA is done, and each call appends its CTAs' stamps to the file set by
// ops::set_decode_timeline_file (synchronising the stream: eager calls only).
// benchmarks/decode_timeline.py runs the calls and summarises the stamps. In other builds the
// stamps compile to nothing and the host hooks to no-ops.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pagedkv::cuda_ops {

// Stamps per CTA, then its SM id: one record of kTimelineWords 64-bit words.
enum TimelineStamp { kEntry, kAfterWait, kFirstData, kLoopDone, kCtaDone, kTimelineStamps };
constexpr int kTimelineWords = kTimelineStamps + 1;

#if defined(__CUDACC__)
// Thread 0's stamps (registers), written out at the CTA's end.
struct Timeline {
#if PAGEDKV_DECODE_TIMELINE
  uint64_t t[kTimelineStamps] = {};
  __device__ __forceinline__ void stamp(int i) {
    if (threadIdx.x == 0) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t[i]));
  }
  // Called by every thread at the CTA's end.
  __device__ __forceinline__ void write(uint64_t* out) {
    __syncthreads();  // every warp is done
    stamp(kCtaDone);
    if (threadIdx.x != 0 || out == nullptr) return;
    const uint64_t cta = blockIdx.x + gridDim.x * (blockIdx.y + uint64_t(gridDim.y) * blockIdx.z);
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    for (int i = 0; i < kTimelineStamps; ++i) out[cta * kTimelineWords + i] = t[i];
    out[cta * kTimelineWords + kTimelineStamps] = sm;
  }
#else
  __device__ __forceinline__ void stamp(int) {}
  __device__ __forceinline__ void write(uint64_t*) {}
#endif
};
#endif

// The device buffer a launch of `ctas` CTAs on `s` writes its records to, zeroed (a CTA that
// returns early leaves zeros), or nullptr (no profiling build, or no file set).
uint64_t* decode_timeline_buffer(uint64_t ctas, cudaStream_t s);
// After the launch: waits for `s` and appends the records to the file (no-op for nullptr).
void decode_timeline_dump(uint64_t* buffer, uint64_t ctas, cudaStream_t s);

}  // namespace pagedkv::cuda_ops
