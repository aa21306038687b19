// pagedkv — a paged KV-cache serving core: block allocator, scheduler, paged-attention kernels.
// The one header a C++ application includes.
#pragma once

#include "pagedkv/block_allocator.h"
#include "pagedkv/error.h"
#include "pagedkv/layer_ops.h"
#include "pagedkv/moe.h"
#include "pagedkv/ops.h"
#include "pagedkv/quant.h"
#include "pagedkv/sampling_ops.h"
#include "pagedkv/scheduler.h"
#include "pagedkv/scheduler_config.h"
#include "pagedkv/step_plan.h"
#include "pagedkv/tensor.h"
#include "pagedkv/version.h"
