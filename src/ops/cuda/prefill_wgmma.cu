// Host side of the Hopper wgmma prefill: the opt-in switch, which calls the kernel covers, and the
// per-dtype launch (kernels instantiated in prefill_wgmma_{f16,bf16}.cu).
#include <cstdlib>

#include "ops/cuda/common.cuh"
#include "ops/cuda/prefill_wgmma.h"

namespace pagedkv::cuda_ops {
namespace {

constexpr int kMaxDevices = 64;

// Compute capability major of the current device, queried once per device.
int cc_major() {
  static int major[kMaxDevices] = {};  // 0: not queried yet (a benign race: same value written)
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev < 0 || dev >= kMaxDevices) return 0;
  if (major[dev] == 0) {
    check_cuda(cudaDeviceGetAttribute(&major[dev], cudaDevAttrComputeCapabilityMajor, dev),
               "cudaDeviceGetAttribute");
  }
  return major[dev];
}

// Whether the build carries the kernel's sm_90a code for the current device, checked once per
// device (the answer cannot change while the library is loaded).
bool sm90a_code() {
  static int known[kMaxDevices] = {};  // 0: not checked yet, 1: yes, 2: no
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev < 0 || dev >= kMaxDevices) return false;
  if (known[dev] == 0) known[dev] = prefill_wg::has_sm90a_code() ? 1 : 2;
  return known[dev] == 1;
}

}  // namespace

int prefill_wgmma_mode() {
  const char* v = std::getenv("PAGEDKV_PREFILL_WGMMA");
  return v != nullptr && *v != '\0' ? std::atoi(v) : 0;
}

bool prefill_wgmma_supported(const AttnParams& p, DType qdtype, KVCacheDType cache) {
  if (qdtype != DType::kFloat16 && qdtype != DType::kBFloat16) return false;
  if (cache != KVCacheDType::kAuto || (p.head_size != 64 && p.head_size != 128)) return false;
  // The producer copies whole 16-byte runs of keys and values (cache and new tokens).
  const prefill::VecFlags vf = prefill::vec_flags(p);
  if (!vf.k_cache || !vf.v_cache || !vf.fresh) return false;
  return cc_major() == 9 && sm90a_code();
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
