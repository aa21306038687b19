// The first tensor-core prefill kernel (64 query rows per CTA, 16 per warp), kept as the default
// until the BM-128 kernel (prefill_mma_kernel.cuh) has run on a GPU; PAGEDKV_PREFILL_MMA picks
// between them (prefill_mma.cu).
//
// A CTA of 4 warps owns BM = 64 query rows of one sequence and one KV head; rows pack
// (token, query head of the group) pairs, so every K/V tile loaded into shared memory serves
// the whole GQA group. Each warp computes S = Q K^T for its 16 rows with mma.sync m16n8k16
// (fp32 accumulators), applies scale / soft-cap / alibi / causal and window masks, updates an
// online softmax in registers, and accumulates O += P V with P taken straight from the S
// accumulators. K/V tiles of BN keys come from the paged cache (context) or from key/value (new
// tokens) through cp.async, double-buffered so the next tile loads while this one is used.
#include "ops/cuda/common.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/prefill_mma.h"

namespace pagedkv::cuda_ops {
namespace {

constexpr int BM = 64, kThreads = 128;
constexpr float kLog2e = 1.4426950408889634f;

template <int DP>
constexpr int block_n() {
  return DP <= 128 ? 64 : 32;
}
template <int DP>
constexpr int smem_bytes() {
  return (BM + 4 * block_n<DP>()) * (DP + 8) * 2;
}

__device__ __forceinline__ bool is_aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// Copies 8 elements at `src` (run of `x` contiguous elements along d) into shared memory.
template <typename T>
__device__ __forceinline__ void load_chunk(T* dst, const T* base, const CacheLayout& l,
                                           int64_t block, int slot, int head, int d0) {
  const T* src = base + l.offset(block, slot, head, d0);
  if (l.x >= 8 && is_aligned16(src)) {
    cp_async16(dst, src);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) dst[i] = base[l.offset(block, slot, head, d0 + i)];
  }
}

template <typename T, int DP>
__global__ void __launch_bounds__(kThreads)
    prefill_mma_kernel(const AttnParams p, int tiles_per_seq) {
  constexpr int BN = block_n<DP>(), LD = DP + 8, CH = DP / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);  // [BM][LD]
  T* sK = sQ + BM * LD;                // [2][BN][LD]
  T* sV = sK + 2 * BN * LD;            // [2][BN][LD]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int seq = blockIdx.x / tiles_per_seq;
  const int tile = tiles_per_seq - 1 - blockIdx.x % tiles_per_seq;  // longest rows first
  const int kvh = blockIdx.y, G = p.group, D = p.head_size;
  const int qs = min(max(p.query_start_loc[seq], 0), p.num_q);     // bad metadata: no wild
  const int qlen = min(p.query_start_loc[seq + 1], p.num_q) - qs;  // reads or writes
  const int rows = qlen * G, r0 = tile * BM;
  if (r0 >= rows) return;
  const int ctx = p.seq_lens[seq] - qlen;
  const int k_hi = ctx + (min(r0 + BM, rows) - 1) / G + 1;
  const int k_lo = p.window > 0 ? max(0, ctx + r0 / G - p.window + 1) : 0;
  const T* qg = static_cast<const T*>(p.q);
  const T* kc = static_cast<const T*>(p.k_cache);
  const T* vc = static_cast<const T*>(p.v_cache);
  const T* kn = static_cast<const T*>(p.k_new);
  const T* vn = static_cast<const T*>(p.v_new);
  const int* bt = p.block_tables + int64_t(seq) * p.bt_stride;
  const uint4 zero = make_uint4(0, 0, 0, 0);

  // Q tile (zeros for padding rows and the head-size padding), and zeros in the K/V padding.
  for (int idx = tid; idx < BM * CH; idx += kThreads) {
    const int r = idx / CH, c = idx % CH, gr = r0 + r;
    T* dst = sQ + r * LD + c * 8;
    if (gr < rows && c * 8 < D) {
      const T* src =
          qg + int64_t(qs + gr / G) * p.q_s_tok + int64_t(kvh * G + gr % G) * p.q_s_head + c * 8;
      if (is_aligned16(src)) {
        cp_async16(dst, src);
      } else {
        for (int i = 0; i < 8; ++i) dst[i] = src[i];
      }
    } else {
      *reinterpret_cast<uint4*>(dst) = zero;
    }
  }
  for (int idx = tid; idx < 2 * BN * CH; idx += kThreads) {
    const int j = idx / CH, c = idx % CH;
    if (c * 8 >= D) {
      *reinterpret_cast<uint4*>(sK + j * LD + c * 8) = zero;
      *reinterpret_cast<uint4*>(sV + j * LD + c * 8) = zero;
    }
  }

  auto load_kv = [&](int kt, int stage) {
    T* dk = sK + stage * BN * LD;
    T* dv = sV + stage * BN * LD;
    for (int idx = tid; idx < BN * CH; idx += kThreads) {
      const int j = idx / CH, c = idx % CH, key = kt + j;
      if (c * 8 >= D) continue;
      T* k_dst = dk + j * LD + c * 8;
      T* v_dst = dv + j * LD + c * 8;
      if (key >= k_hi) {  // past the tile's last key: zeros (P is 0 there, V must not be NaN)
        *reinterpret_cast<uint4*>(k_dst) = zero;
        *reinterpret_cast<uint4*>(v_dst) = zero;
      } else if (key < ctx) {
        const int bi = p.bs_shift >= 0 ? key >> p.bs_shift : key / p.block_size;
        const int slot = key - bi * p.block_size;
        const int b = bt[min(bi, p.max_blocks - 1)];
        const int64_t block = unsigned(b) < unsigned(p.num_blocks) ? b : 0;  // no wild reads
        load_chunk(k_dst, kc, p.kl, block, slot, kvh, c * 8);
        load_chunk(v_dst, vc, p.vl, block, slot, kvh, c * 8);
      } else {
        const int64_t t = qs + (key - ctx);
        load_chunk(k_dst, kn, p.knl, t, 0, kvh, c * 8);
        load_chunk(v_dst, vn, p.vnl, t, 0, kvh, c * 8);
      }
    }
    cp_async_commit();
  };

  // Per-thread rows of the accumulator fragments: A = warp*16 + lane/4, B = A + 8.
  int q_pos[2], head[2];
  float slope[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int gr = r0 + warp * 16 + lane / 4 + 8 * h;
    q_pos[h] = ctx + gr / G;
    head[h] = kvh * G + gr % G;
    slope[h] = p.alibi != nullptr && gr < rows ? p.alibi[head[h]] : 0.f;
  }
  float o[DP / 8][4];
#pragma unroll
  for (int n = 0; n < DP / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  const bool need_extras = p.softcap > 0.f || p.alibi != nullptr;
  const float scale_log2 = p.qk_scale * kLog2e;
  const int max_q_pos = k_hi - 1;
  const int n_tiles = k_hi > k_lo ? (k_hi - k_lo + BN - 1) / BN : 0;
  if (n_tiles > 0) load_kv(k_lo, 0);
  for (int it = 0; it < n_tiles; ++it) {
    const int kt = k_lo + it * BN, stage = it & 1;
    if (it + 1 < n_tiles) {
      load_kv(kt + BN, stage ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* tk = sK + stage * BN * LD;
    const T* tv = sV + stage * BN * LD;

    // S = Q K^T (16 rows x BN keys per warp).
    float s[BN / 8][4];
#pragma unroll
    for (int n = 0; n < BN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, sQ + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int nb = 0; nb < BN / 16; ++nb) {
        uint32_t b[4];
        ldmatrix_x4(b, tk + (nb * 16 + (lane >> 4) * 8 + (lane & 7)) * LD + kk * 16 +
                           ((lane >> 3) & 1) * 8);
        mma_16816<T>(s[2 * nb], a, b[0], b[1]);
        mma_16816<T>(s[2 * nb + 1], a, b[2], b[3]);
      }
    }

    // Logits in the log2 domain with masks, then the online-softmax update. Tiles wholly below
    // the diagonal and inside the window need no per-element work beyond the scale.
    float mx[2] = {m[0], m[1]};
    const bool plain = !need_extras && kt + BN - 1 <= ctx + r0 / G && kt + BN <= k_hi &&
                       (p.window <= 0 || kt > max_q_pos - p.window);
    if (plain) {
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[n][e] *= scale_log2;
          mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
        }
      }
    } else {
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e >> 1, key = kt + n * 8 + 2 * (lane & 3) + (e & 1);
          float x = s[n][e] * p.qk_scale;
          if (p.softcap > 0.f) x = p.softcap * tanhf(x / p.softcap);
          x = (x + slope[h] * float(key - q_pos[h])) * kLog2e;
          const bool masked =
              key > q_pos[h] || key >= k_hi || (p.window > 0 && key <= q_pos[h] - p.window);
          s[n][e] = masked ? -INFINITY : x;
          mx[h] = fmaxf(mx[h], s[n][e]);
        }
      }
    }
    float alpha[2], ms[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      ms[h] = mx[h] == -INFINITY ? 0.f : mx[h];
      alpha[h] = exp2f(m[h] - ms[h]);
      m[h] = mx[h];
      l[h] *= alpha[h];
    }
#pragma unroll
    for (int n = 0; n < BN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2f(s[n][e] - ms[e >> 1]);
        l[e >> 1] += s[n][e];
      }
    }
#pragma unroll
    for (int n = 0; n < DP / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }

    // O += P V, P from the S accumulators (the C layout of two n-tiles is one A fragment).
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[4];
      a[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int nd = 0; nd < DP / 16; ++nd) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, tv + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + nd * 16 +
                                 (lane >> 4) * 8);
        mma_16816<T>(o[2 * nd], a, b[0], b[1]);
        mma_16816<T>(o[2 * nd + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // this stage is overwritten by the load issued next iteration
  }

  // Normalise and store the valid rows.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const int gr = r0 + warp * 16 + lane / 4 + 8 * h;
    if (gr >= rows) continue;
    const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
    T* dst =
        static_cast<T*>(p.out) + int64_t(qs + gr / G) * p.o_s_tok + int64_t(head[h]) * p.o_s_head;
#pragma unroll
    for (int n = 0; n < DP / 8; ++n) {
      const int d = n * 8 + 2 * (lane & 3);
      if (d < D) {
        dst[d] = from_float<T>(o[n][2 * h] * inv);
        dst[d + 1] = from_float<T>(o[n][2 * h + 1] * inv);
      }
    }
  }
}

template <typename T, int DP>
void launch_dp(const AttnParams& p, int max_query_len, cudaStream_t s) {
  const int tiles = std::max(1, (max_query_len * p.group + BM - 1) / BM);
  const dim3 grid(p.num_seqs * tiles, p.num_kv_heads);
  constexpr int smem = smem_bytes<DP>();
  auto kernel = prefill_mma_kernel<T, DP>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "context_attention_fwd");
  kernel<<<grid, kThreads, smem, s>>>(p, tiles);
}

template <typename T>
void launch_typed(const AttnParams& p, int max_query_len, cudaStream_t s) {
  switch (p.head_size) {
    case 32: launch_dp<T, 32>(p, max_query_len, s); break;
    case 64: launch_dp<T, 64>(p, max_query_len, s); break;
    case 80: launch_dp<T, 80>(p, max_query_len, s); break;
    case 96: launch_dp<T, 96>(p, max_query_len, s); break;
    case 112: launch_dp<T, 112>(p, max_query_len, s); break;
    case 120:
    case 128: launch_dp<T, 128>(p, max_query_len, s); break;
    case 192: launch_dp<T, 192>(p, max_query_len, s); break;
    default: launch_dp<T, 256>(p, max_query_len, s); break;
  }
}

}  // namespace

void launch_prefill_mma_v1(const AttnParams& p, DType qdtype, int max_query_len, cudaStream_t s) {
  if (p.num_seqs == 0 || max_query_len <= 0) return;
  if (qdtype == DType::kFloat16) {
    launch_typed<__half>(p, max_query_len, s);
  } else {
    launch_typed<__nv_bfloat16>(p, max_query_len, s);
  }
}

}  // namespace pagedkv::cuda_ops
