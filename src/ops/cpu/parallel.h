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

// Threads used by parallel_for: set_num_threads's count, else the CPUs this process may use; fixed
// at the first call (the pool is sized once).
int num_threads();

// Fixes num_threads() to n (> 0) before the first use (pagedkv reads PAGEDKV_NUM_THREADS into it
// at import); ValueError afterwards unless n is the count already in use.
void set_num_threads(int n);

// `work` estimates the total cost (roughly multiply-adds or bytes moved); below
// kMinParallelWork the items run on the calling thread, since waking the workers costs more
// than tiny calls (a decode step of a small model calls the ops once per layer).
inline constexpr int64_t kMinParallelWork = int64_t{1} << 17;

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn,
                  int64_t work = kMinParallelWork);

}  // namespace pagedkv::cpu_ops
