// CUDA-core paged attention: decode (one query per sequence) and the prefill fallback (one query
// per token). Meant to be bound by memory bandwidth, so it is shaped around the loads:
//  - one CTA serves GC query heads of one KV group (GQA/MQA): each KV byte is read once for the
//    whole group, not once per query head;
//  - a row of TX lanes (a run-time power of two) covers one key, VEC = 8 elements per lane, a
//    warp 32/TX keys, the 4 warps ROWS keys; each lane streams its K/V runs through a private
//    S-stage cp.async ring in shared memory (attend_range), U keys per stage;
//  - online softmax in the log2 domain (FlashAttention), one state per row and head, merged
//    across rows by shuffles and across warps through shared memory at the end;
//  - split mode writes normalised partial outputs with their max logit and exp-sum (vLLM v2).
// Measured on an H100 it is instruction-issue bound (benchmarks/RESULTS.md, "CUDA kernels"):
// the per-key softmax / shuffle work is replicated over the TX lanes of a row.
#pragma once

#include <cfloat>
#include <type_traits>

#include "ops/cuda/attention_params.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/split_k.cuh"

namespace pagedkv::cuda_ops {

constexpr float kLog2e = 1.4426950408889634f;

constexpr int VEC = 8;  // elements per lane per key: 16 bytes of fp16/bf16, 8 of fp8, 32 of fp32

// VEC elements of storage type CT as raw bits, loaded with 8- or 16-byte vector loads.
template <typename CT>
struct Raw {
  static constexpr int kBytes = VEC * static_cast<int>(sizeof(CT));
  using Word = std::conditional_t<kBytes == 8, uint2, uint4>;
  static constexpr int kWords = kBytes / static_cast<int>(sizeof(Word));
  Word u[kWords];
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < kWords; ++i) u[i] = Word{};
  }
  __device__ __forceinline__ CT* elems() { return reinterpret_cast<CT*>(u); }
};

// Where one lane's run of one source lives: base + block * s_block + slot * s_slot + off
// (the head and the lane's head-dimension offset folded into `off`, computed once).
struct RunAddr {
  int64_t s_block, s_slot, off, off4;  // off4: the second half of a float32 vLLM key run
  int mode;                            // 0: one vector run, 1: two float4 runs, 2: elements
};

template <typename CT>
__device__ __forceinline__ RunAddr make_run_addr(const CacheLayout& l, int head, int d0, int D,
                                                 bool vec) {
  RunAddr a;
  a.s_block = l.s_block;
  a.s_slot = l.s_slot;
  a.off = head * l.s_head + (d0 / l.x) * l.s_chunk + d0 % l.x;
  a.off4 = head * l.s_head + ((d0 + 4) / l.x) * l.s_chunk + (d0 + 4) % l.x;
  const bool whole = vec && d0 + VEC <= D;
  a.mode = whole && l.x >= VEC ? 0 : (whole && sizeof(CT) == 4 && l.x == 4) ? 1 : 2;
  return a;
}

// Starts copying the VEC elements of (block, slot) into the lane's staging slot `dst` (zeros
// past head_size); cp.async where the run is a vector, plain loads otherwise.
template <typename CT>
__device__ __forceinline__ void stage_run(Raw<CT>* dst, const CT* base, const CacheLayout& l,
                                          const RunAddr& a, int64_t block, int slot, int head,
                                          int d0, int D) {
  const CT* src = base + block * a.s_block + int64_t(slot) * a.s_slot;
  if (a.mode == 0) {
    if constexpr (Raw<CT>::kBytes == 8) {
      cp_async8(dst, src + a.off);
    } else {
#pragma unroll
      for (int w = 0; w < Raw<CT>::kWords; ++w)
        cp_async16(&dst->u[w], src + a.off + w * 16 / sizeof(CT));
    }
  } else if (a.mode == 1) {
    cp_async16(&dst->u[0], src + a.off);
    cp_async16(&dst->u[Raw<CT>::kWords - 1], src + a.off4);
  } else {
    Raw<CT> r;
    r.zero();
    CT* e = r.elems();
    for (int i = 0; i < VEC; ++i) {
      if (d0 + i < D) e[i] = base[l.offset(block, slot, head, d0 + i)];
    }
    *dst = r;
  }
}

template <typename CT, int KIND>
__device__ __forceinline__ void raw_to_float(Raw<CT>& r, float* f) {
  if constexpr (KIND != kNoFp8) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(r.u);
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i) {
      const float2 v = fp8x2_to_float2<KIND>(h[i]);
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  } else if constexpr (sizeof(CT) == 2) {
    unpack8(r.u[0], static_cast<const CT*>(nullptr), f);
  } else {
    const float* e = reinterpret_cast<const float*>(r.u);
#pragma unroll
    for (int i = 0; i < VEC; ++i) f[i] = e[i];
  }
}

// Merges softmax state (m2, l2, acc2) into (m, l, acc); states are in the log2 domain.
__device__ __forceinline__ void merge_state(float& m, float& l, float* acc, float m2, float l2,
                                            const float* acc2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;
  const float a = exp2f(m - mx), b = exp2f(m2 - mx);
  l = l * a + l2 * b;
#pragma unroll
  for (int i = 0; i < VEC; ++i) acc[i] = acc[i] * a + acc2[i] * b;
  m = mx;
}

// Lane geometry: a row of TX lanes (2^tx_shift) covers one key; ROWS rows per CTA.
struct Lanes {
  int tx_shift, tx, row, rows, d0;
};

constexpr int kThreads = 128;

// Attends this lane's row to the keys [lo, hi) of one source (the paged cache, or the new
// tokens' rows at key index + row_off), updating its softmax state (m, l, acc). Keys stream
// through an S-stage cp.async ring in shared memory private to each lane (no barriers: a lane
// reads back only what it copied), so S - 1 stages of U keys stay in flight per lane without
// holding registers.
template <typename ST, int KIND, int GC, int U, int S, bool kPaged>
__device__ __forceinline__ void attend_range(
    const AttnParams& p, Raw<ST>* ring, const ST* kb, const ST* vb, const CacheLayout& kl,
    const CacheLayout& vl, bool vec, const int* bt, int64_t row_off, int lo, int hi,
    const Lanes& ln, int kvh, int q_pos, const float (&q)[GC][VEC], const float (&slope)[GC],
    float k_mul, float v_mul, float (&m)[GC], float (&l)[GC], float (&acc)[GC][VEC]) {
  if (lo >= hi) return;
  const int step = ln.rows * U;
  const int D = p.head_size;
  const RunAddr ka = make_run_addr<ST>(kl, kvh, ln.d0, D, vec);
  const RunAddr va = make_run_addr<ST>(vl, kvh, ln.d0, D, vec);
  auto slot_of = [&](int s, int u, int kv) -> Raw<ST>* {
    return ring + ((s * U + u) * 2 + kv) * kThreads + threadIdx.x;
  };
  // Block ids of a stage's keys, loaded one stage ahead of its copies (dependent lookup).
  auto lookup = [&](int base, int64_t* blk) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int tok = base + u * ln.rows + ln.row;
      if constexpr (kPaged) {
        const int bi =
            min(p.bs_shift >= 0 ? tok >> p.bs_shift : tok / p.block_size, p.max_blocks - 1);
        const int b = tok < hi ? bt[bi] : 0;
        blk[u] = unsigned(b) < unsigned(p.num_blocks) ? b : 0;  // bad ids: no wild reads
      } else {
        blk[u] = row_off + tok;
      }
    }
  };
  auto issue = [&](int base, const int64_t* blk, int s) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int tok = base + u * ln.rows + ln.row;
      if (tok < hi) {
        int slot = 0;
        if constexpr (kPaged) {
          slot = p.bs_shift >= 0 ? tok & (p.block_size - 1) : tok % p.block_size;
        }
        stage_run(slot_of(s, u, 0), kb, kl, ka, blk[u], slot, kvh, ln.d0, D);
        stage_run(slot_of(s, u, 1), vb, vl, va, blk[u], slot, kvh, ln.d0, D);
      }
    }
    cp_async_commit();
  };

  int64_t blk[U];
  lookup(lo, blk);
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    issue(lo + s * step, blk, s);
    lookup(lo + (s + 1) * step, blk);
  }
  for (int it = 0, base = lo; base < hi; ++it, base += step) {
    issue(base + (S - 1) * step, blk, (it + S - 1) % S);  // past hi: an empty group
    lookup(base + S * step, blk);
    cp_async_wait<S - 1>();  // this iteration's stage has landed
    const int cur = it % S;

    float s[GC][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float kf[VEC];
      Raw<ST> r = *slot_of(cur, u, 0);
      raw_to_float<ST, KIND>(r, kf);
#pragma unroll
      for (int g = 0; g < GC; ++g) {
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < VEC; ++i) dot = fmaf(q[g][i], kf[i], dot);
        s[g][u] = dot;
      }
    }
    for (int o = ln.tx >> 1; o > 0; o >>= 1) {  // sum the row's partial dot products
#pragma unroll
      for (int g = 0; g < GC; ++g) {
#pragma unroll
        for (int u = 0; u < U; ++u) s[g][u] += __shfl_xor_sync(0xffffffffu, s[g][u], o);
      }
    }
    // Logits (log2 domain) and the online-softmax update.
    float pr[GC][U];
#pragma unroll
    for (int g = 0; g < GC; ++g) {
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int tok = base + u * ln.rows + ln.row;
        float x = s[g][u] * k_mul;
        if (p.softcap > 0.f) x = p.softcap * tanhf(x / p.softcap);
        x = (x + slope[g] * float(tok - q_pos)) * kLog2e;
        s[g][u] = tok < hi ? x : -INFINITY;
        mx = fmaxf(mx, s[g][u]);
      }
      const float ms = mx == -INFINITY ? 0.f : mx;  // all masked so far: keep zeros, no NaN
      const float alpha = exp2f(m[g] - ms);
      float sum = 0.f;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        pr[g][u] = exp2f(s[g][u] - ms);
        sum += pr[g][u];
      }
      l[g] = l[g] * alpha + sum;
      m[g] = mx;
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[g][i] *= alpha;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int tok = base + u * ln.rows + ln.row;
      if (tok >= hi) continue;  // its slot holds stale data: p is 0 but 0 * NaN is not
      float vf[VEC];
      Raw<ST> r = *slot_of(cur, u, 1);
      raw_to_float<ST, KIND>(r, vf);
#pragma unroll
      for (int g = 0; g < GC; ++g) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc[g][i] = fmaf(pr[g][u] * v_mul, vf[i], acc[g][i]);
      }
    }
  }
  cp_async_wait<0>();  // no copy may land in the ring after it is reused
}

constexpr int kNumWarps = 4;
constexpr int kMaxDW = 256;  // the largest head size

// Grid: (num_q, num_kv_heads * n_gchunks, partitions); 128 threads. tx_shift: log2 lanes per key.
template <typename QT, typename CT, int KIND, int GC>
__global__ void __launch_bounds__(128) paged_attention_kernel(const AttnParams p, int tx_shift) {
  constexpr int NW = kNumWarps;
  constexpr int RAW = sizeof(Raw<CT>) > sizeof(Raw<QT>) ? sizeof(Raw<CT>) : sizeof(Raw<QT>);
  constexpr int U = 2;                  // keys per lane per stage
  constexpr int S = RAW <= 16 ? 4 : 2;  // stages (shared memory: S * U * 2 * 128 * RAW bytes)
  constexpr int RING = S * U * 2 * kThreads * RAW;
  constexpr int ACC = NW * GC * kMaxDW * 4;
  // The staging ring and, after the key loop, the cross-warp merge share one buffer.
  __shared__ __align__(16) unsigned char smem[RING > ACC ? RING : ACC];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  Lanes ln;
  ln.tx_shift = tx_shift;
  ln.tx = 1 << tx_shift;
  const int tx = lane & (ln.tx - 1), ty = lane >> tx_shift;
  ln.row = warp * (32 >> tx_shift) + ty;
  ln.rows = NW * (32 >> tx_shift);
  ln.d0 = tx * VEC;
  const int D = p.head_size, d0 = ln.d0;
  const int item = blockIdx.x;
  const int kvh = blockIdx.y / p.n_gchunks;
  const int g0 = (blockIdx.y % p.n_gchunks) * GC;
  const int ng = min(GC, p.group - g0);
  const int part = blockIdx.z;

  // ---- which sequence, query position and key range ----
  int seq = item, ctx_len, q_pos, new_base = 0;
  int last_key;  // the last key position the query sees (its own, or its sequence's last)
  if (p.query_start_loc != nullptr) {
    int lo = 0, hi = p.num_seqs - 1;  // last seq with query_start_loc[seq] <= item
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (p.query_start_loc[mid] <= item)
        lo = mid;
      else
        hi = mid - 1;
    }
    seq = lo;
    const int qs = p.query_start_loc[seq];
    const int qlen = p.query_start_loc[seq + 1] - qs;
    ctx_len = p.seq_lens[seq] - qlen;
    q_pos = ctx_len + (item - qs);
    last_key = p.causal ? q_pos : ctx_len + qlen - 1;
    new_base = qs;
  } else {
    ctx_len = p.seq_lens[seq];
    q_pos = last_key = ctx_len - 1;
  }
  int k_lo, k_hi;
  if (!key_range(p, last_key, part, k_lo, k_hi)) return;

  // ---- this lane's slice of the GC queries ----
  float q[GC][VEC];
  const QT* qbase = static_cast<const QT*>(p.q) + int64_t(item) * p.q_s_tok;
#pragma unroll
  for (int g = 0; g < GC; ++g) {
    const int h = kvh * p.group + g0 + g;
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      q[g][i] = (g < ng && d0 + i < D) ? to_float(qbase[int64_t(h) * p.q_s_head + d0 + i]) : 0.f;
    }
  }
  float slope[GC];
#pragma unroll
  for (int g = 0; g < GC; ++g) {
    slope[g] = (p.alibi != nullptr && g < ng) ? p.alibi[kvh * p.group + g0 + g] : 0.f;
  }

  float m[GC], l[GC], acc[GC][VEC];
#pragma unroll
  for (int g = 0; g < GC; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[g][i] = 0.f;
  }

  const int* bt = p.block_tables + int64_t(seq) * p.bt_stride;
  // Cached context from the paged cache, then the new tokens from key/value (prefill).
  attend_range<CT, KIND, GC, U, S, true>(
      p, reinterpret_cast<Raw<CT>*>(smem), static_cast<const CT*>(p.k_cache),
      static_cast<const CT*>(p.v_cache), p.kl, p.vl, p.kv_vec, bt, 0, k_lo, min(k_hi, ctx_len), ln,
      kvh, q_pos, q, slope, p.qk_scale * p.k_scale.get(), p.v_scale.get(), m, l, acc);
  // The new tokens' ring holds Raw<QT>, whose slots overlap other lanes' Raw<CT> slots: wait
  // for every lane to finish the cached context first (uniform per CTA).
  if (sizeof(Raw<QT>) != sizeof(Raw<CT>)) __syncthreads();
  if (k_hi > ctx_len) {
    attend_range<QT, kNoFp8, GC, U, S, false>(
        p, reinterpret_cast<Raw<QT>*>(smem), static_cast<const QT*>(p.k_new),
        static_cast<const QT*>(p.v_new), p.knl, p.vnl, p.new_vec, nullptr,
        int64_t(new_base) - ctx_len, max(k_lo, ctx_len), k_hi, ln, kvh, q_pos, q, slope, p.qk_scale,
        1.f, m, l, acc);
  }

  // ---- merge the rows of each warp (lanes tx, tx + TX, ...) ----
  for (int o = ln.tx; o < 32; o <<= 1) {
#pragma unroll
    for (int g = 0; g < GC; ++g) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m[g], o);
      const float l2 = __shfl_xor_sync(0xffffffffu, l[g], o);
      float a2[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) a2[i] = __shfl_xor_sync(0xffffffffu, acc[g][i], o);
      merge_state(m[g], l[g], acc[g], m2, l2, a2);
    }
  }

  // ---- merge the warps through shared memory and write ----
  const int DW = ln.tx * VEC;
  auto sm_acc = reinterpret_cast<float (*)[GC][kMaxDW]>(smem);
  __shared__ float sm_m[NW][GC], sm_l[NW][GC];
  __syncthreads();  // every lane is done with its staging ring
  if (ty == 0) {
#pragma unroll
    for (int g = 0; g < GC; ++g) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) sm_acc[warp][g][d0 + i] = acc[g][i];
      if (tx == 0) {
        sm_m[warp][g] = m[g];
        sm_l[warp][g] = l[g];
      }
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < GC * DW; idx += NW * 32) {
    const int g = idx / DW, d = idx % DW;
    if (g >= ng || d >= D) continue;
    merge_store<QT, NW>(
        p, seq, item, kvh * p.group + g0 + g, part, d, 1.f, [&](int w) { return sm_m[w][g]; },
        [&](int w) { return sm_l[w][g]; }, [&](int w) { return sm_acc[w][g][d]; });
  }
}

// Lanes per key: the head size in runs of VEC, rounded up to a power of two (<= 32).
inline int lanes_shift(int head_size) { return log2_int((head_size + VEC - 1) / VEC); }

template <typename QT, typename CT, int KIND>
void launch_cache(const AttnParams& p, dim3 grid, cudaStream_t s) {
  const int shift = lanes_shift(p.head_size);
  switch (heads_per_cta(p.group)) {
    case 1: paged_attention_kernel<QT, CT, KIND, 1><<<grid, kThreads, 0, s>>>(p, shift); break;
    case 4: paged_attention_kernel<QT, CT, KIND, 4><<<grid, 128, 0, s>>>(p, shift); break;
    default: paged_attention_kernel<QT, CT, KIND, 8><<<grid, 128, 0, s>>>(p, shift); break;
  }
}

template <typename QT>
void launch_attention(const AttnParams& p, int cache_fp8, cudaStream_t s) {
  const int parts = p.partition_size > 0 ? p.max_parts : 1;
  const dim3 grid(p.num_q, p.num_kv_heads * p.n_gchunks, parts);
  if (cache_fp8 == kE4M3) {
    launch_cache<QT, uint8_t, kE4M3>(p, grid, s);
  } else if (cache_fp8 == kE5M2) {
    launch_cache<QT, uint8_t, kE5M2>(p, grid, s);
  } else {
    launch_cache<QT, QT, kNoFp8>(p, grid, s);
  }
}

}  // namespace pagedkv::cuda_ops
