// A persistent team of worker threads. The calling thread is worker 0 and
// takes part in every job, so a team of N uses N threads in all (one per core,
// never more). Jobs are dispatched by bumping a generation counter that the
// workers spin on briefly before sleeping, which keeps the per-job handoff
// cost in the low microseconds for back-to-back jobs such as a decode step's
// matrix products. The caller waits for the team the same way: a short spin,
// a few yields, then a futex sleep, so that a worker that lost its core to
// another process gets it back instead of competing with a spinner.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace megakern {

class ThreadPool {
 public:
  // n_threads <= 0 picks the number of available cores. More threads than
  // available cores are only used when `oversubscribe` is set (or the
  // environment variable MEGAKERN_FORCE_THREADS=1): spinning workers that
  // outnumber cores take turns at every barrier and slow each other down by
  // orders of magnitude. Otherwise the count is capped, with a warning.
  explicit ThreadPool(int n_threads = 0, bool oversubscribe = false);

  // Cores this process may run on (its CPU affinity), at least 1.
  static int available_cores();
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(worker) on every worker (0..size()-1) and returns when all are
  // done. Not reentrant: fn must not call run() on the same pool.
  void run(const std::function<void(int worker)>& fn);

  // Splits [0, n) into size() contiguous ranges, one per worker, aligned to
  // `grain`, and calls fn(begin, end) for each non-empty range.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop(int worker);

  int n_threads_;
  std::vector<std::thread> threads_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace megakern
