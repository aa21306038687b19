// Host side of TMA tensor maps (cuTensorMapEncodeTiled, reached through the runtime's driver
// entry point so the library does not link libcuda), shared by the Hopper decode and prefill.
#pragma once

#include <cuda.h>  // CUtensorMap (a plain struct; the driver is reached at run time)

#include <cstdint>

#include "ops/cuda/attention_params.h"

namespace pagedkv::cuda_ops {

// Whether the driver offers cuTensorMapEncodeTiled (queried once).
bool tensor_maps_available();

// Encodes a rank-`rank` tensor of `esz`-byte elements (1 or 2) at `base`: dims innermost first,
// strides[i] the bytes between steps of dimension i + 1 (multiples of 16), boxes of `box`
// elements landing in shared memory with the 128-byte swizzle (16-byte unit u of box row r at
// unit u ^ (r % 8) in each 1024-byte group: box[0] * esz must be 128). Elements outside the
// tensor read as zeros. False when the driver is missing or refuses the map.
bool encode_sw128(CUtensorMap* map, const void* base, int rank, const uint64_t* dims,
                  const int64_t* strides, const uint32_t* box, int esz);

// A paged cache (row layout: d contiguous) as a 4-D tensor (dims, heads, slots, blocks) whose
// boxes are `rows` slots (16, or a whole block) of one head and one 128-byte slice of the head
// dimension.
bool encode_cache_map(CUtensorMap* map, const void* base, const CacheLayout& l, const AttnParams& a,
                      int esz, int rows = 16);

// An fp8 (one-byte) paged cache in boxes of 16 slots of one head, whole rows of head_size bytes
// (a multiple of 16, at most 256), landing unswizzled: row r of a box at r * head_size bytes.
bool encode_cache_rows(CUtensorMap* map, const void* base, const CacheLayout& l,
                       const AttnParams& a);

}  // namespace pagedkv::cuda_ops
