// Host side of the tensor-core prefill: which calls it serves, and which operands can be moved with
// 16-byte copies; the kernels are instantiated per query dtype in prefill_mma_{f16,bf16}.cu.
#include "ops/cuda/common.cuh"
#include "ops/cuda/prefill_mma.h"

namespace pagedkv::cuda_ops {
namespace {

// 16-byte runs along d: base aligned and both outer strides multiples of 8 (2-byte) elements.
bool rows16(const void* base, int64_t s0, int64_t s1) {
  return aligned16(base) && s0 % 8 == 0 && s1 % 8 == 0;
}

}  // namespace

const char* prefill_mma_uncovered(const AttnParams& p, DType qdtype) {
  if (qdtype != DType::kFloat16 && qdtype != DType::kBFloat16) {
    return "queries must be float16 or bfloat16";
  }
  if (p.head_size % 8 != 0 || p.head_size > 256) return "head_size must be a multiple of 8";
  return nullptr;
}

prefill::VecFlags prefill::vec_flags(const AttnParams& p) {
  prefill::VecFlags vf;
  vf.q = rows16(p.q, p.q_s_tok, p.q_s_head);
  vf.out = rows16(p.out, p.o_s_tok, p.o_s_head);
  // Caches: 16-byte aligned runs of >= 8 elements along d (NHD rows, vLLM key chunks; vLLM values
  // stride along d and take the scalar path). An fp8 cache's 8 elements are one 8-byte load.
  vf.k_cache = p.kv_vec && p.kl.x % 8 == 0;
  vf.v_cache = p.kv_vec && p.vl.x % 8 == 0;
  vf.fresh = p.new_vec;
  vf.cache_fp8 = kNoFp8;  // set by the launch from the call's cache dtype
  return vf;
}

void launch_prefill_mma(const AttnParams& p, DType qdtype, KVCacheDType cache, int max_query_len,
                        cudaStream_t s) {
  if (p.num_seqs == 0 || max_query_len <= 0) return;
  prefill::VecFlags vf = prefill::vec_flags(p);
  vf.cache_fp8 = fp8_kind(cache);
  if (qdtype == DType::kFloat16) {
    prefill::launch_f16(p, vf, max_query_len, s);
  } else {
    prefill::launch_bf16(p, vf, max_query_len, s);
  }
}

}  // namespace pagedkv::cuda_ops
