// Pieces shared by the executors: the slot arena and a spinning barrier.
#pragma once

#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

#include "exec/op_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace megakern {

// How many pause instructions a waiting worker spins before it starts
// yielding its core. Short: an op's tile lasts microseconds, and when workers
// outnumber free cores a longer spin only delays the worker being waited for.
constexpr int kSpinsBeforeYield = 256;

inline void spin_pause() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// Backing store for a program's slots: [max_rows][width] floats each.
struct SlotArena {
  explicit SlotArena(const DecodeProgram& p);
  // Points ctx.slot at the arena, with the logits slot at the caller's buffer.
  void bind(StepContext& ctx, const DecodeProgram& p, float* logits);
  std::vector<size_t> offsets;
  std::vector<float> storage;
};

// Sense-reversing barrier for a fixed team; spins, then yields if a member
// has been descheduled.
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void arrive_and_wait() {
    if (n_ == 1) return;
    const unsigned gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      count_.store(0, std::memory_order_relaxed);
      gen_.store(gen + 1, std::memory_order_release);
      return;
    }
    for (int spins = 0; gen_.load(std::memory_order_acquire) == gen; ++spins) {
      if (spins < kSpinsBeforeYield)
        spin_pause();
      else
        std::this_thread::yield();
    }
  }

 private:
  const int n_;
  alignas(64) std::atomic<int> count_{0};
  alignas(64) std::atomic<unsigned> gen_{0};
};

}  // namespace megakern
