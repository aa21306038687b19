// Device properties the launchers consult on every call (queried once per device, then cached:
// a cudaDeviceGetAttribute per launch is measurable next to a 5 us kernel), and the
// environment's tuning knobs.
#pragma once

namespace pagedkv::cuda_ops {

int current_device();
int sm_count(int device);       // streaming multiprocessors
int compute_major(int device);  // 9 on Hopper

// An integer knob from the environment, read per call (a getenv is nothing next to a launch);
// `fallback` when unset or empty.
int env_int(const char* name, int fallback);

}  // namespace pagedkv::cuda_ops
