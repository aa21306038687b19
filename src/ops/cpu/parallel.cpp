// Persistent worker pool behind parallel_for (see parallel.h).
#include "ops/cpu/parallel.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "pagedkv/error.h"

namespace pagedkv::cpu_ops {
namespace {

thread_local bool t_in_parallel = false;

std::atomic<int> g_requested{0};  // set_num_threads's count; 0: the usable CPUs

int detect_threads() {
  if (const int n = g_requested.load(); n > 0) return n;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

class Pool {
 public:
  explicit Pool(int workers) : owner_pid_(getpid()) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { worker(); });
  }
  // Workers are detached at exit rather than joined: joining during static destruction can
  // deadlock when the interpreter tears down first.
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.detach();
  }

  bool usable() const { return getpid() == owner_pid_ && !threads_.empty(); }

  // Runs fn over [0, n) with the workers; returns false (did nothing) when the pool is busy.
  bool run(int64_t n, const std::function<void(int64_t)>& fn) {
    std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = &fn;
      n_ = n;
      next_.store(0);
      active_ = static_cast<int>(threads_.size());
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    drain();
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [this] { return active_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 private:
  void drain() {
    t_in_parallel = true;
    for (int64_t i; (i = next_.fetch_add(1)) < n_;) {
      try {
        (*fn_)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        if (!error_) error_ = std::current_exception();
        next_.store(n_);
      }
    }
    t_in_parallel = false;
  }

  void worker() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      drain();
      std::lock_guard<std::mutex> lk(mu_);
      if (--active_ == 0) done_cv_.notify_one();
    }
  }

  pid_t owner_pid_;
  std::vector<std::thread> threads_;
  std::mutex run_mu_;  // one parallel_for at a time
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  int active_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

Pool& pool() {
  static Pool* p = new Pool(num_threads() - 1);  // leaked on purpose (see ~Pool)
  return *p;
}

}  // namespace

int num_threads() {
  static const int n = detect_threads();
  return n;
}

void set_num_threads(int n) {
  PAGEDKV_CHECK(n > 0, "num_threads must be > 0, got ", n);
  g_requested.store(n);
  PAGEDKV_CHECK(num_threads() == n, "num_threads: the CPU kernels already run on ", num_threads(),
                " threads; the count is fixed at their first use");
}

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn, int64_t work) {
  if (n <= 0) return;
  if (n > 1 && work >= kMinParallelWork && !t_in_parallel && num_threads() > 1) {
    Pool& p = pool();
    if (p.usable() && p.run(n, fn)) return;
  }
  for (int64_t i = 0; i < n; ++i) fn(i);
}

}  // namespace pagedkv::cpu_ops
