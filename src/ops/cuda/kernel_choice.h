// The one rule by which an attention op picks its kernel under the caller's choice
// (AttentionOptions::kernel, include/pagedkv/ops.h): the op lists its kernels in order of
// preference, each with why it does not cover the call (nullptr: it does).
#pragma once

#include <initializer_list>

#include "pagedkv/error.h"
#include "pagedkv/ops.h"

namespace pagedkv::cuda_ops {

// kAuto: the first kernel of `order` that covers the call (the last one must cover everything).
// A named kernel: that one, or ValueError naming `op`, the kernel and why it does not cover the
// call. why(kernel) is asked only of the kernels considered.
template <typename Why>
AttentionKernel choose_kernel(AttentionKernel choice, const char* op,
                              std::initializer_list<AttentionKernel> order, Why&& why) {
  for (const AttentionKernel k : order) {
    if (choice != AttentionKernel::kAuto && choice != k) continue;
    const char* reason = why(k);
    if (reason == nullptr) return k;
    PAGEDKV_CHECK(choice == AttentionKernel::kAuto, op, ": kernel '", attention_kernel_name(k),
                  "' does not cover this call: ", reason);
  }
  throw ValueError(
      ::pagedkv::detail::concat(op, ": no CUDA kernel '", attention_kernel_name(choice), "'"));
}

}  // namespace pagedkv::cuda_ops
