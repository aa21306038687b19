// pagedkv — a paged KV-cache serving core: block allocator, scheduler, paged-attention kernels.
// The one header a C++ application includes.
#pragma once

#include "pagedkv/error.h"
#include "pagedkv/tensor.h"
#include "pagedkv/version.h"
#include "pagedkv/ops.h"
#if __has_include("pagedkv/block_allocator.h")
#include "pagedkv/block_allocator.h"
#endif
#if __has_include("pagedkv/scheduler.h")
#include "pagedkv/scheduler.h"
#endif
