// Device dispatch of the ops that take callables (layer_ops.cpp, sampling_ops.cpp): the CUDA
// body for arrays on the GPU, the CPU body otherwise, nothing for an empty call; a build
// without CUDA rejects GPU arrays by name.
#pragma once

#include <cstdint>

#include "pagedkv/error.h"
#include "pagedkv/tensor.h"

namespace pagedkv::ops::detail {

template <typename Cpu, typename Cuda>
void dispatch(const TensorView& first, int64_t items, const char* op, Cpu&& cpu, Cuda&& cuda) {
#ifdef PAGEDKV_WITH_CUDA
  if (first.device().is_cuda()) {
    if (items > 0) cuda();
    return;
  }
  (void)op;
#else
  (void)cuda;
  PAGEDKV_CHECK(!first.device().is_cuda(), op, ": the arrays are on ", first.device().str(),
                " but pagedkv was built without CUDA");
#endif
  if (items > 0) cpu();
}

}  // namespace pagedkv::ops::detail
