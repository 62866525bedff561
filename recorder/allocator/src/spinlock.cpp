// The shard lock's futex calls (spinlock.hpp).
#include "cachealloc/detail/spinlock.hpp"

#if defined(__linux__) && defined(__LP64__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>

namespace cachealloc::detail {

namespace {

static_assert(sizeof(std::atomic<int>) == sizeof(int) && std::atomic<int>::is_always_lock_free,
              "the futex word is the atomic's int");

int* futex_word(std::atomic<int>& word) noexcept { return reinterpret_cast<int*>(&word); }

}  // namespace

bool futex_sleep(std::atomic<int>& word, int expected, long ns) noexcept {
  const int saved = errno;
  const timespec limit{ns / 1'000'000'000, ns % 1'000'000'000};  // relative, for FUTEX_WAIT
  const long result = ::syscall(SYS_futex, futex_word(word), FUTEX_WAIT_PRIVATE, expected, &limit, nullptr, 0);
  const bool timed_out = result != 0 && errno == ETIMEDOUT;
  errno = saved;
  return !timed_out;
}

void futex_wake_one(std::atomic<int>& word) noexcept {
  const int saved = errno;
  ::syscall(SYS_futex, futex_word(word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
  errno = saved;
}

}  // namespace cachealloc::detail
#endif
