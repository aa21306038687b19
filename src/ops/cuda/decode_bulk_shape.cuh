// The Hopper decode's compile-time shape (decode_bulk.cuh): the constants every part of the
// kernel shares and, per instantiation, the types and tile counts derived from the query dtype,
// the cache's fp8 kind, the head size and the query-head column tiles.
#pragma once

#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/decode_bulk.h"

namespace pagedkv::cuda_ops::bulk_decode {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kKeys = 16;  // keys per chunk: the 16 rows of S^T, one k step of O^T += V^T P^T
constexpr float kL2e = 1.4426950408889634f;
constexpr float kSlack = 8.f;  // lazy maximum: how far (log2) a logit may exceed the reference

// QT: the query dtype; KIND: the cache's fp8 kind (kNoFp8: the cache holds QT); HD: the head size
// (a multiple of 16, of 32 with fp8); NH: 8-head column tiles per CTA (1 or 2).
template <typename QT, int KIND, int HD, int NH>
struct Shape {
  static_assert(HD % 16 == 0 && (KIND == kNoFp8 || HD % 32 == 0));
  static constexpr int kKind = KIND, kNH = NH;
  static constexpr int KD = HD / 16, D = HD;  // 16-wide head-dimension steps
  static constexpr int kOutPitch = bulk_out_pitch(HD);
  static constexpr bool kFp8 = KIND != kNoFp8;
  static constexpr bool kEarly = bulk_early_release(HD, NH);
  static constexpr int NR = 8 * NH;              // query heads (S^T columns) per CTA
  static constexpr bool kQRegs = KD * NH <= 16;  // query fragments live in registers
  // ldmatrix.x4 per K (or V) tile: one per k step, or per two with fp8 (byte pairs as b16).
  static constexpr int NK = kFp8 ? KD / 2 : KD;
  using Q = QT;
  using CT = std::conditional_t<kFp8, uint8_t, QT>;  // cache element
  using MT = std::conditional_t<kFp8, __half, QT>;   // MMA operand
};

}  // namespace pagedkv::cuda_ops::bulk_decode
