// Launch of the wgmma prefill kernel (prefill_wgmma_kernel.cuh) per query dtype and head size.
#pragma once

#include <algorithm>

#include "ops/cuda/prefill_wgmma_kernel.cuh"

namespace pagedkv::cuda_ops::prefill_wg {

template <typename T, int DP, bool kFp8>
void launch_dp(const WgParams& wp, int max_query_len, cudaStream_t s) {
  using C = Tile<DP>;
  const AttnParams& p = wp.a;
  const int64_t tiles =
      std::max<int64_t>(1, (int64_t(max_query_len) * p.group + C::BM - 1) / C::BM);
  const int64_t ctas = tiles * p.num_seqs * p.num_kv_heads;
  PAGEDKV_CHECK(ctas < (int64_t{1} << 31), "context_attention_fwd: too many query tiles");
  launch_with_smem(prefill_wgmma_kernel<T, DP, kFp8>, static_cast<unsigned>(ctas), C::kThreads,
                   C::kSmem, s, "context_attention_fwd", wp);
}

template <typename T, bool kFp8>
void launch_cache(const WgParams& wp, int max_query_len, cudaStream_t s) {
  if (wp.a.head_size == 64) {
    launch_dp<T, 64, kFp8>(wp, max_query_len, s);
  } else {
    launch_dp<T, 128, kFp8>(wp, max_query_len, s);
  }
}

template <typename T>
void launch_typed(const WgParams& wp, int max_query_len, cudaStream_t s) {
  if (wp.vf.cache_fp8 != kNoFp8) {
    launch_cache<T, true>(wp, max_query_len, s);
  } else {
    launch_cache<T, false>(wp, max_query_len, s);
  }
}

// The kernel image the current device would run was compiled for compute capability 9.x (with
// the default PAGEDKV_CUDA_ARCHS "80;90a": the sm_90a one; an sm_80 image has only the trap).
template <typename T, int DP>
bool has_code_for() {
  cudaFuncAttributes a{};
  if (cudaFuncGetAttributes(&a, prefill_wgmma_kernel<T, DP, false>) != cudaSuccess) {
    cudaGetLastError();  // no image for this device: not an error of the caller's
    return false;
  }
  return a.binaryVersion >= 90 && a.binaryVersion < 100;
}

}  // namespace pagedkv::cuda_ops::prefill_wg
