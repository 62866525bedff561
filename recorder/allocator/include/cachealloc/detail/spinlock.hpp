// A test-and-test-and-set spinlock for critical sections of a few dozen
// instructions (stats updates, pointer-map probes), where a futex-backed
// mutex would cost more than the work it guards.
#pragma once

#include <algorithm>
#include <atomic>
#include <mutex>
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

namespace cachealloc::detail {

// A shard's lock. Uncontended, lock is one inline compare-and-swap and
// unlock one plain store (pthread_mutex_lock and _unlock, out of line, were
// 12% of a cached alloc+free pair on a 2-core x86 machine; an unlock by
// exchange, which drains the store buffer of the critical section's stores,
// another 16%). A waiter spins briefly, then sleeps on the lock word (a futex),
// because the slow path holds a shard's lock across device calls.
//
// The unlock reads `sleepers_` with no fence after its store: the C++
// memory model lets that read come first and see a stale 0, and x86 and Arm
// do let a load pass an earlier store, for an instant. An unlock can then
// miss a waiter going to sleep. What guarantees progress is that waiters
// sleep with a timeout and look again: a missed wake delays a waiter, never
// strands it. The first sleep is kFirstSleepNs; each one that times out
// doubles, up to kMaxSleepNs, so that a waiter on a lock held across a long
// device call does not poll it ten thousand times a second. A fence in
// unlock would close the window and cost what the exchange did.
//
// Only where the futex takes a 64-bit timespec (LP64 Linux); the test
// instantiates long sleeps, so that only unlock's wake can end them.
#if defined(__linux__) && defined(__LP64__)
// The futex calls, out of line (spinlock.cpp); errno is kept.
bool futex_sleep(std::atomic<int>& word, int expected, long ns) noexcept;  // false: timed out
void futex_wake_one(std::atomic<int>& word) noexcept;

template <long kFirstSleepNs, long kMaxSleepNs>
class BasicFutexMutex {
 public:
  void lock() noexcept {
    int expected = 0;
    if (!state_.compare_exchange_strong(expected, 1, std::memory_order_acquire)) [[unlikely]]
      lock_contended();
  }
  bool try_lock() noexcept {
    int expected = 0;
    return state_.compare_exchange_strong(expected, 1, std::memory_order_acquire);
  }
  void unlock() noexcept {
    state_.store(0, std::memory_order_release);
    if (sleepers_.load(std::memory_order_relaxed) != 0) [[unlikely]]
      futex_wake_one(state_);
  }

 private:
  [[gnu::noinline]] void lock_contended() noexcept {
    for (int spins = 0; spins < 256; ++spins) {
      CACHEALLOC_CPU_RELAX();
      if (grab()) return;
    }
    // Then give the core away a few times before sleeping: with more
    // threads than cores the holder may be waiting for one, and a yield
    // lets it finish without the futex's two context switches.
    for (int yields = 0; yields < 16; ++yields) {
      std::this_thread::yield();
      if (grab()) return;
    }
    long sleep_ns = kFirstSleepNs;
    for (;;) {
      // Counted before the lock word is read again: an unlock whose read of
      // sleepers_ comes after this wakes us; one whose read came first may
      // not, and then the timeout does.
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      bool timed_out = false;
      if (state_.load(std::memory_order_seq_cst) != 0) timed_out = !futex_sleep(state_, 1, sleep_ns);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      if (grab()) return;
      if (timed_out && sleep_ns < kMaxSleepNs) sleep_ns = std::min(2 * sleep_ns, kMaxSleepNs);
    }
  }
  bool grab() noexcept {
    int expected = 0;
    return state_.load(std::memory_order_relaxed) == 0 &&
           state_.compare_exchange_strong(expected, 1, std::memory_order_acquire);
  }

  std::atomic<int> state_{0};     // 0 free, 1 held
  std::atomic<int> sleepers_{0};  // waiters asleep on state_, or about to be
};
// First sleep 0.1 ms, then up to 2 ms.
using FutexMutex = BasicFutexMutex<100'000, 2'000'000>;
#else
// Elsewhere (no futex with a timeout): unlock by exchange, so that it sees
// every sleeper (Drepper, "Futexes Are Tricky", mutex 2). State: 0 free,
// 1 held, 2 held with sleepers.
class FutexMutex {
 public:
  void lock() noexcept {
    int expected = 0;
    if (!state_.compare_exchange_strong(expected, 1, std::memory_order_acquire)) [[unlikely]]
      lock_contended();
  }
  bool try_lock() noexcept {
    int expected = 0;
    return state_.compare_exchange_strong(expected, 1, std::memory_order_acquire);
  }
  void unlock() noexcept {
    if (state_.exchange(0, std::memory_order_release) == 2) [[unlikely]]
      state_.notify_one();
  }

 private:
  void lock_contended() noexcept {
    for (int spins = 0; spins < 256; ++spins) {
      CACHEALLOC_CPU_RELAX();
      int expected = 0;
      if (state_.load(std::memory_order_relaxed) == 0 &&
          state_.compare_exchange_strong(expected, 1, std::memory_order_acquire))
        return;
    }
    while (state_.exchange(2, std::memory_order_acquire) != 0) state_.wait(2, std::memory_order_relaxed);
  }
  std::atomic<int> state_{0};
};
#endif

// Under ThreadSanitizer the pools keep std::mutex, whose lock order TSan
// checks (a lock-order inversion between shard locks was found that way).
#if defined(__SANITIZE_THREAD__)
using ShardMutex = std::mutex;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
using ShardMutex = std::mutex;
#else
using ShardMutex = FutexMutex;
#endif
#else
using ShardMutex = FutexMutex;
#endif

}  // namespace cachealloc::detail
