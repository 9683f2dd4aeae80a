#include "core/thread_pool.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace megakern {
namespace {
inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}
// How long an idle worker spins before it sleeps on the condition variable.
constexpr auto kSpinTime = std::chrono::microseconds(200);
// How long the caller of run() spins, then yields, before it sleeps until the
// last worker is done.
constexpr int kCallerSpins = 2048;
constexpr int kCallerYields = 16;
}  // namespace

int ThreadPool::available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

ThreadPool::ThreadPool(int n_threads, bool oversubscribe) {
  const int cores = available_cores();
  if (n_threads <= 0) n_threads = cores;
  if (n_threads > cores) {
    const char* env = std::getenv("MEGAKERN_FORCE_THREADS");
    if (!oversubscribe && !(env && std::strcmp(env, "1") == 0)) {
      fmt::print(stderr,
                 "megakern: {} threads asked for, but this process may use only {} cores: using {} "
                 "(set MEGAKERN_FORCE_THREADS=1 to use more)\n",
                 n_threads, cores, cores);
      n_threads = cores;
    }
  }
  n_threads_ = n_threads;
  for (int w = 1; w < n_threads_; ++w) threads_.emplace_back([this, w] { worker_loop(w); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::worker_loop(int worker) {
  uint64_t seen = 0;
  for (;;) {
    auto start = std::chrono::steady_clock::now();
    uint64_t gen;
    int spins = 0;
    while ((gen = generation_.load(std::memory_order_acquire)) == seen) {
      cpu_relax();
      if (++spins % 1024 == 0 && std::chrono::steady_clock::now() - start > kSpinTime) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      }
    }
    seen = gen;
    if (stop_.load()) return;
    (*job_)(worker);
    // The last worker out wakes the caller if it went to sleep (the notify
    // costs no system call when nobody waits).
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

void ThreadPool::run(const std::function<void(int)>& fn) {
  if (n_threads_ == 1) {
    fn(0);
    return;
  }
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_release);
  {
    // Taking the lock orders the generation bump against a worker that is
    // about to sleep, so no wake-up is lost.
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  cv_.notify_all();
  fn(0);
  // Spin briefly (the common case: the others finish within microseconds),
  // then yield a little, then sleep on the counter: if a worker has been
  // descheduled (another process took its core), spinning or yielding would
  // only compete with it for the core it needs.
  int spins = 0;
  for (int left; (left = pending_.load(std::memory_order_acquire)) != 0; ++spins) {
    if (spins < kCallerSpins)
      cpu_relax();
    else if (spins < kCallerSpins + kCallerYields)
      std::this_thread::yield();
    else
      pending_.wait(left, std::memory_order_acquire);
  }
  job_ = nullptr;
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t chunks = (n + grain - 1) / grain;
  const int workers = static_cast<int>(std::min<int64_t>(n_threads_, chunks));
  if (workers <= 1) {
    fn(0, n);
    return;
  }
  run([&](int w) {
    if (w >= workers) return;
    const int64_t c0 = chunks * w / workers, c1 = chunks * (w + 1) / workers;
    const int64_t b = c0 * grain, e = std::min(n, c1 * grain);
    if (b < e) fn(b, e);
  });
}

}  // namespace megakern
