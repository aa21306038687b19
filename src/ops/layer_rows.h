// Row addressing of the layer ops (include/pagedkv/layer_ops.h): an array of rank 1 to 3 is a
// list of contiguous rows of its last dimension, the leading dimensions with any strides (a
// q / k view of a fused qkv projection), so the kernels need no copy. Shared by the CPU and
// CUDA backends (plain data, usable in device code).
#pragma once

#include <cstdint>

#include "pagedkv/tensor.h"

#ifdef __CUDACC__
#define PAGEDKV_HOST_DEVICE __host__ __device__
#else
#define PAGEDKV_HOST_DEVICE
#endif

namespace pagedkv::ops {

struct RowGeometry {
  int64_t rows = 0;   // product of the leading dimensions
  int64_t n1 = 1;     // size of the second leading dimension (1 for rank <= 2)
  int64_t s0 = 0;     // element strides of the leading dimensions
  int64_t s1 = 0;
  int64_t width = 0;  // the last dimension

  // Element offset of row r.
  PAGEDKV_HOST_DEVICE int64_t offset(int64_t r) const { return (r / n1) * s0 + (r % n1) * s1; }
};

// The rows of a validated rank-1..3 array with a contiguous last dimension.
inline RowGeometry row_geometry(const TensorView& t) {
  RowGeometry g;
  g.width = t.size(-1);
  if (t.ndim() == 1) {
    g.rows = 1;
  } else if (t.ndim() == 2) {
    g.rows = t.size(0);
    g.s0 = t.stride(0);
  } else {
    g.n1 = t.size(1) > 0 ? t.size(1) : 1;
    g.rows = t.size(0) * t.size(1);
    g.s0 = t.stride(0);
    g.s1 = t.stride(1);
  }
  return g;
}

}  // namespace pagedkv::ops
