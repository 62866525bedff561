// The pool lock's slow half (spinlock.hpp): spinning, sleeping and waking.
#include "spinlock.hpp"

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ctime>

namespace cachealloc::detail {

namespace {

static_assert(sizeof(std::atomic<int>) == sizeof(int) && std::atomic<int>::is_always_lock_free,
              "the futex word is the atomic's int");

int* futex_word(std::atomic<int>& state) noexcept { return reinterpret_cast<int*>(&state); }

}  // namespace

void FutexMutex::lock_contended() noexcept {
  for (int spins = 0; spins < 256; ++spins) {
    CACHEALLOC_CPU_RELAX();
    int expected = 0;
    if (state_.load(std::memory_order_relaxed) == 0 &&
        state_.compare_exchange_strong(expected, 1, std::memory_order_acquire))
      return;
  }
  const timespec limit{0, kSleepLimitNs};
  for (;;) {
    // Announced before the lock word is read again: an unlock whose read of
    // sleepers_ comes after this sees it and wakes us; one whose read came
    // before may not, and then the timeout does.
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    if (state_.load(std::memory_order_seq_cst) != 0)
      ::syscall(SYS_futex, futex_word(state_), FUTEX_WAIT_PRIVATE, 1, &limit, nullptr, 0);
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    int expected = 0;
    if (state_.load(std::memory_order_relaxed) == 0 &&
        state_.compare_exchange_strong(expected, 1, std::memory_order_acquire))
      return;
  }
}

void FutexMutex::wake_one() noexcept {
  ::syscall(SYS_futex, futex_word(state_), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

}  // namespace cachealloc::detail
#endif
