// Argument validation shared by the CPU and CUDA backends of the ops (src/ops/ops.cpp).
// Every check throws ValueError / TypeError naming the argument. Checks that must read array
// *values* (block ids, sequence lengths, slots) run only for host arrays: on the GPU they would
// need a device synchronisation, which the CUDA path must never do (CUDA-graph safety).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <utility>

#include "pagedkv/ops.h"

namespace pagedkv::ops::detail {

struct Named {
  const TensorView* t;
  std::string_view name;
};

// Named arrays: a braced list at the call, or an array an op keeps to pass to two checks.
struct NamedList {
  NamedList(std::initializer_list<Named> l) : first_(l.begin()), size_(l.size()) {}
  template <size_t N>
  NamedList(const Named (&a)[N]) : first_(a), size_(N) {}  // NOLINT: implicit by design
  const Named* begin() const { return first_; }
  const Named* end() const { return first_ + size_; }

 private:
  const Named* first_;
  size_t size_;
};

// Geometry of a validated pair of KV caches.
struct CacheGeometry {
  KVLayout layout;
  int64_t num_blocks, block_size, num_kv_heads, head_size;
};

// Every array with elements has data: a null pointer (a TensorView built from nullptr, or a
// DLTensor without data) raises ValueError naming the argument instead of a crash in a kernel.
void check_data(NamedList arrays);

// All arrays have data (check_data) and are on one device (a host array and a pinned-host
// array count as the same); raises ValueError naming the first argument and the first one
// that differs.
void check_devices(NamedList arrays);

// Everything but dim 0 is row-major contiguous (blocks may be strided, e.g. kv_cache[0]); an
// array without elements always is.
bool block_contiguous(const TensorView& t);

// An array the op writes holds each element once: a stride-0 (torch expand) or otherwise
// self-overlapping view would make the kernel's writes to different indices race for one
// location, so it raises ValueError naming the array. (Dims of size > 1, sorted by |stride|,
// must each step past everything the smaller ones span: sufficient, and true of every view that
// slicing or transposing an allocation gives.)
void check_no_self_overlap(const TensorView& t, std::string_view name);

// The written array `out` shares no bytes with any of `reads` (their address ranges are
// disjoint): the kernels read their inputs while they write, so an output aliasing an input
// (in place, or a view of the same buffer) is a silent wrong answer on some tilings. Arrays on
// different devices never collide (one virtual address space). ValueError naming both.
void check_no_overlap(const Named& out, NamedList reads);

// CUDA kernels read the 1-D metadata arrays (seq_lens, query_start_loc, slot_mapping,
// alibi_slopes) densely and block table rows with unit stride: on a CUDA array a stride the
// kernels would ignore raises ValueError naming the array (host arrays may have any stride).
void check_cuda_dense(const TensorView& t, std::string_view name);

// Float32 / float16 / bfloat16 (TypeError otherwise).
void check_float(const TensorView& t, std::string_view name);

// [n0, n1, head_size] rows with a contiguous last dimension; -1 = any size.
void check_rows(const TensorView& t, std::string_view name, int64_t n0, int64_t n1, int64_t d);

void check_head_size(int64_t head_size, std::string_view name);
// fp8 scales (Scale): numbers and host arrays positive and finite with a finite reciprocal; arrays
// float32 with one element, on `device` (the op's arrays' device).
void check_scales(const Scale& k_scale, const Scale& v_scale, const Device& device);

// Validates key_cache / value_cache: layout (rank 5 = vLLM, rank 4 = NHD; `want` forces one),
// dtype (the `dtype` of the data for "auto", uint8 for fp8), x = 16 / element_size, contiguity
// of everything but the block dimension, and agreement of the two caches.
CacheGeometry check_kv_caches(const TensorView& key_cache, const TensorView& value_cache,
                              KVCacheDType kv_dtype, DType dtype, const KVLayout* want);

// Scale, soft-cap, ALiBi slopes ([num_heads] float32), fp8 scales, and a named kernel against the
// device of the arrays (`device`: the query's).
void check_attention_options(const AttentionOptions& o, int64_t num_heads, const Device& device);

// Host-side value checks of the paged metadata for one sequence: its visible token range
// [first, end) must lie inside its block-table row and its block ids inside [0, num_blocks).
void check_seq_blocks(const TensorView& block_tables, int64_t seq, int64_t first, int64_t end,
                      const CacheGeometry& g);

// [n, 2] int64 block pairs (src, dst); on host arrays also checks src < src_blocks and
// dst < dst_blocks.
void check_block_mapping(const TensorView& m, std::string_view name, int64_t src_blocks,
                         int64_t dst_blocks);

// Element i of a host int32/int64 1-D array.
int64_t host_int(const TensorView& t, int64_t i);

}  // namespace pagedkv::ops::detail
