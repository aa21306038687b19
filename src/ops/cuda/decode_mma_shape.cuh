// The tensor-core decode's compile-time shape (decode_mma.cuh): constants every part of the
// kernel shares and, per instantiation, the cache element and the per-lane copy counts derived
// from the query dtype, the cache's fp8 kind and the head-dimension steps provisioned.
#pragma once

#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/decode_mma.h"

namespace pagedkv::cuda_ops::mma_decode {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kKeys = 16;  // keys per warp chunk: two n8 tiles of S, one k16 step of P·V
constexpr float kL2e = 1.4426950408889634f;

// QT: the query dtype; KIND: the cache's fp8 kind (kNoFp8: the cache holds QT); KD: 16-wide
// head-dimension steps provisioned (head_size <= 16 KD).
template <typename QT, int KIND, int KD_>
struct Shape {
  using Q = QT;
  using CT = std::conditional_t<KIND == kNoFp8, QT, uint8_t>;  // cache element
  static constexpr int kKind = KIND, KD = KD_;
  static constexpr bool kFp8 = KIND != kNoFp8;
  static constexpr int EPR = 16 / static_cast<int>(sizeof(CT));    // elements per 16-byte run
  static constexpr int NT = 2 * KD;                                // 8-wide output column tiles
  static constexpr int NIK = (kKeys * (KD * 16 / EPR) + 31) / 32;  // key-row runs per lane/chunk
  static constexpr int NIV = (KD * 16 * (kKeys / EPR) + 31) / 32;  // [d][slot] runs per lane/chunk
  static constexpr bool kQRegs = KD <= 4;  // query fragments stay in registers up to D = 64
};

}  // namespace pagedkv::cuda_ops::mma_decode
