// Host side of the Hopper wgmma prefill: the opt-in switch, which calls the kernel covers, and the
// per-dtype launch (kernels instantiated in prefill_wgmma_{f16,bf16}.cu).
#include <atomic>

#include "ops/cuda/common.cuh"
#include "ops/cuda/device_props.h"
#include "ops/cuda/prefill_wgmma.h"

namespace pagedkv::cuda_ops {
namespace {

// Whether the build carries the kernel's sm_90a code for `device`, checked once per device (the
// answer cannot change while the library is loaded).
bool sm90a_code(int device) {
  static std::atomic<int> known[64];  // 0: not checked yet, 1: yes, 2: no
  if (device < 0 || device >= 64) return prefill_wg::has_sm90a_code();
  int v = known[device].load(std::memory_order_relaxed);
  if (v == 0) {
    v = prefill_wg::has_sm90a_code() ? 1 : 2;
    known[device].store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

}  // namespace

int prefill_wgmma_mode() { return env_int("PAGEDKV_PREFILL_WGMMA", 0); }

const char* prefill_wgmma_uncovered(const AttnParams& p, DType qdtype, KVCacheDType cache) {
  const int dev = current_device();
  if (compute_major(dev) != 9) return "needs a compute capability 9.x (Hopper) device";
  if (!sm90a_code(dev)) return "not compiled for sm_90a (PAGEDKV_CUDA_ARCHS)";
  if (qdtype != DType::kFloat16 && qdtype != DType::kBFloat16) {
    return "queries must be float16 or bfloat16";
  }
  if (cache != KVCacheDType::kAuto) return "the cache must hold the query dtype (no fp8)";
  if (p.head_size != 64 && p.head_size != 128) return "head size must be 64 or 128";
  // The producer copies whole 16-byte runs of keys and values (cache and new tokens).
  const prefill::VecFlags vf = prefill::vec_flags(p);
  if (!vf.k_cache || !vf.v_cache || !vf.fresh) {
    return "key / value rows (cache and new tokens) must be 16-byte runs (NHD cache layout)";
  }
  return nullptr;
}

void launch_prefill_wgmma(const AttnParams& p, DType qdtype, int max_query_len, cudaStream_t s) {
  if (p.num_seqs == 0 || max_query_len <= 0) return;
  const prefill::VecFlags vf = prefill::vec_flags(p);
  if (qdtype == DType::kFloat16) {
    prefill_wg::launch_f16(p, vf, max_query_len, s);
  } else {
    prefill_wg::launch_bf16(p, vf, max_query_len, s);
  }
}

}  // namespace pagedkv::cuda_ops
