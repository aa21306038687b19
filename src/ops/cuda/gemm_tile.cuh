// Shared pieces of the gathered-tile GEMM kernels (moe_gemm.cu, quant_gemm.cu): a CTA of 128
// threads computes a [BM, 64] output tile over K in steps of 32, from shared-memory tiles of
// the left rows (gathered, each from its own pointer) and the right rows (the weight's output
// rows, W[n, k], read as W^T). fp16 / bf16 multiply on tensor cores (WMMA 16x16x16, fp32
// accumulators, one 16-column strip per warp), fp32 on CUDA cores.
#pragma once

#include <mma.h>

#include <type_traits>

#include "ops/cuda/common.cuh"

namespace pagedkv::cuda_ops::gemm_tile {

constexpr int kBN = 64;        // output columns per CTA
constexpr int kBK = 32;        // K per shared-memory tile
constexpr int kPad = 8;        // row padding of the tiles (bank conflicts)
constexpr int kThreads = 128;  // 4 warps
constexpr int kMaxBM = 64;

template <typename T>
struct Tiles {
  T a[kMaxBM][kBK + kPad];  // left rows (BM used)
  T b[kBN][kBK + kPad];     // right rows: W[n0 + r][k0 ..]
};

// Loads a [ROWS, kBK] tile whose row r starts at src(r) (nullptr: a zero row), columns k0..;
// 16-byte vectors when `vec` (K a multiple of the vector and every row 16-byte aligned).
template <typename T, int ROWS, typename Src>
__device__ __forceinline__ void load_tile(T (*dst)[kBK + kPad], Src src, int64_t k0, int64_t K,
                                          bool vec) {
  constexpr int kVec = 16 / sizeof(T);
  if (vec) {
    for (int idx = threadIdx.x; idx < ROWS * (kBK / kVec); idx += kThreads) {
      const int r = idx / (kBK / kVec), c = (idx % (kBK / kVec)) * kVec;
      const T* row = src(r);
      uint4 v = make_uint4(0, 0, 0, 0);
      if (row != nullptr && k0 + c < K) v = *reinterpret_cast<const uint4*>(row + k0 + c);
      *reinterpret_cast<uint4*>(&dst[r][c]) = v;
    }
  } else {
    for (int idx = threadIdx.x; idx < ROWS * kBK; idx += kThreads) {
      const int r = idx / kBK, c = idx % kBK;
      const T* row = src(r);
      dst[r][c] = row != nullptr && k0 + c < K ? row[k0 + c] : from_float<T>(0.0f);
    }
  }
}

// fp32 accumulation of a [BM, kBN] tile on CUDA cores: thread (ty, tx) owns rows ty, ty + 8,
// ... and columns 4 tx .. 4 tx + 3.
template <int BM>
struct SimtAccumulator {
  float acc[BM / 8][4] = {};
  template <typename T>
  __device__ __forceinline__ void step(const Tiles<T>& t) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    for (int kk = 0; kk < kBK; ++kk) {
      float b[4];
      for (int j = 0; j < 4; ++j) b[j] = to_float(t.b[tx * 4 + j][kk]);
      for (int i = 0; i < BM / 8; ++i) {
        const float x = to_float(t.a[ty + 8 * i][kk]);
        for (int j = 0; j < 4; ++j) acc[i][j] += x * b[j];
      }
    }
  }
  __device__ __forceinline__ void store(float (*out)[kBN + 4]) const {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    for (int i = 0; i < BM / 8; ++i)
      for (int j = 0; j < 4; ++j) out[ty + 8 * i][tx * 4 + j] = acc[i][j];
  }
};

// The same on tensor cores: warp w owns columns 16 w .. 16 w + 15 of every 16-row block.
template <typename T, int BM>
struct WmmaAccumulator {
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc[BM / 16];
  __device__ __forceinline__ WmmaAccumulator() {
    for (int i = 0; i < BM / 16; ++i) nvcuda::wmma::fill_fragment(acc[i], 0.0f);
  }
  __device__ __forceinline__ void step(const Tiles<T>& t) {
    namespace wmma = nvcuda::wmma;
    const int warp = threadIdx.x / 32;
    for (int kk = 0; kk < kBK; kk += 16) {
      // B = W^T: the weight's rows [n][k] read as a column-major [k][n] matrix.
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
      wmma::load_matrix_sync(b, &t.b[warp * 16][kk], kBK + kPad);
      for (int i = 0; i < BM / 16; ++i) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> x;
        wmma::load_matrix_sync(x, &t.a[i * 16][kk], kBK + kPad);
        wmma::mma_sync(acc[i], x, b, acc[i]);
      }
    }
  }
  __device__ __forceinline__ void store(float (*out)[kBN + 4]) const {
    const int warp = threadIdx.x / 32;
    for (int i = 0; i < BM / 16; ++i)
      nvcuda::wmma::store_matrix_sync(&out[i * 16][warp * 16], acc[i], kBN + 4,
                                      nvcuda::wmma::mem_row_major);
  }
};

template <typename T, int BM>
using Accumulator =
    std::conditional_t<std::is_same_v<T, float>, SimtAccumulator<BM>, WmmaAccumulator<T, BM>>;

}  // namespace pagedkv::cuda_ops::gemm_tile
