// A test-and-test-and-set spinlock for critical sections of a few dozen
// instructions (stats updates, pointer-map probes), where a futex-backed
// mutex would cost more than the work it guards.
#pragma once

#include <atomic>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CACHEALLOC_CPU_RELAX() _mm_pause()
#else
#define CACHEALLOC_CPU_RELAX() ((void)0)
#endif

namespace cachealloc::detail {

class Spinlock {
 public:
  void lock() noexcept {
    for (unsigned spins = 0;;) {
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
      while (locked_.load(std::memory_order_relaxed)) {
        // The holder may have been preempted (more threads than cores):
        // after a while, let it run instead of burning its time slice.
        if (++spins < 1024)
          CACHEALLOC_CPU_RELAX();
        else
          std::this_thread::yield();
      }
    }
  }
  bool try_lock() noexcept {
    return !locked_.load(std::memory_order_relaxed) && !locked_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace cachealloc::detail
