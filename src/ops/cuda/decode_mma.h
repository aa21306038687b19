// Tensor-core decode (decode_mma.cuh): host side. The query heads of one KV group are the rows of
// an mma.sync m16n8k16 tile (padded to 16), so each key costs a few tensor-core instructions
// instead of the per-key shuffle reductions and replicated softmax of the CUDA-core kernel.
#pragma once

#include "ops/cuda/attention_params.h"

namespace pagedkv::cuda_ops {

// AttnParams plus what the tensor-core decode derives from the layouts on the host.
struct MmaDecodeParams {
  AttnParams a;
  int gchunks;           // CTAs per KV head: ceil(group / 16)
  int stages;            // cp.async ring depth of each warp (<= kMmaMaxStages)
  int v_trans;           // 1: values stored [d][slot] (vLLM), staged as a [d][key] tile
  int one_block;         // 1: a chunk's 16 keys share one block, run offsets fit 32 bits
  int64_t k_run, v_run;  // elements between consecutive 16-byte runs of one key's row
  int k_pitch, v_pitch;  // elements per row of the 16-bit K / V tiles (D + 8, or 24 when v_trans)
  int stage_bytes;       // one ring stage of one warp (raw bytes of the cache dtype)
  int tile_bytes;        // fp8 only: the warp's dequantised 16-bit K + V tile
  int warp_bytes;        // shared memory of one warp (ring + tile)
  int q_bytes;           // the 16-row query tile shared by the CTA's warps
};

constexpr int kMmaMaxStages = 8;

// nullptr when the tensor-core decode covers this call, else why not. It covers: fp16/bf16
// queries, head size a multiple of 16 (<= 256), 16-byte aligned runs, NHD or vLLM layouts, block
// sizes whose value runs stay within one block. Everything else keeps the CUDA-core kernel.
// vec16: both caches' runs can be moved as 16-byte vectors (vector_ok(cache, 16)).
const char* decode_mma_uncovered(const AttnParams& p, DType qdtype, KVCacheDType cache, bool vec16);

// Launches on `s`; p.partition_size > 0 selects split mode (v2 partial results).
void launch_decode_mma(const AttnParams& p, DType qdtype, KVCacheDType cache, cudaStream_t s);

// Per query dtype (decode_mma_{f16,bf16}.cu).
void launch_decode_mma_f16(const MmaDecodeParams& p, int cache_fp8, dim3 grid, int smem,
                           cudaStream_t s);
void launch_decode_mma_bf16(const MmaDecodeParams& p, int cache_fp8, dim3 grid, int smem,
                            cudaStream_t s);

}  // namespace pagedkv::cuda_ops
