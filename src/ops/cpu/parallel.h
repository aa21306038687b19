// A small persistent thread pool for the CPU kernels (no OpenMP: torch ships its own libgomp and
// two OpenMP runtimes in one process fight over threads).
//
// parallel_for(n, fn) calls fn(i) for every i in [0, n) from the calling thread plus up to
// num_threads() - 1 workers, handing out indices dynamically (tasks may be uneven: sequences of
// different lengths). Nested calls, calls from several threads at once and calls in a forked
// child run serially on the calling thread instead of deadlocking.
#pragma once

#include <cstdint>
#include <functional>

namespace pagedkv::cpu_ops {

// Threads used by parallel_for: PAGEDKV_NUM_THREADS if set, else the CPUs this process may use.
int num_threads();

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

}  // namespace pagedkv::cpu_ops
