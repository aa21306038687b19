// Registration functions of the extension module pagedkv._C, one per bound concept.
#pragma once

#include <nanobind/nanobind.h>

namespace pagedkv::python {

void bind_info(nanobind::module_& m);          // version, build_info, cuda_available
void bind_allocator(nanobind::module_& m);     // BlockAllocator, prefix cache
void bind_scheduler(nanobind::module_& m);     // SchedulerConfig, Scheduler, StepPlan
void bind_ops(nanobind::module_& m);           // the paged KV-cache ops (CPU and CUDA)
void bind_lora(nanobind::module_& m);          // the multi-LoRA ops
void bind_moe(nanobind::module_& m);           // the mixture-of-experts ops
void bind_quant(nanobind::module_& m);         // the weight-only int4 GEMM
void bind_layer_ops(nanobind::module_& m);     // the fused layer ops (norms, rotary, activations)
void bind_sampling_ops(nanobind::module_& m);  // sampling thresholds (top-k / top-p / min-p)

}  // namespace pagedkv::python
