// The shard lock (cachealloc/detail/spinlock.hpp): mutual exclusion under
// contention, waiters that sleep rather than spin while a holder keeps the
// lock (the slow path holds it across device calls), and waiters that all get
// the lock once it is free.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "cachealloc/detail/spinlock.hpp"

using cachealloc::detail::FutexMutex;

namespace {

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

TEST_CASE("the shard lock excludes: threads hammering one lock lose no increment") {
  FutexMutex mutex;
  long counter = 0;  // plain: only the lock orders the threads' updates
  constexpr int kThreads = 8;
  constexpr long kEach = 100'000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      for (long i = 0; i < kEach; ++i) {
        std::lock_guard lock(mutex);
        // A read, a pause and a write: an overlap of two holders loses one.
        const long seen = counter;
        if ((i & 255) == 0) std::this_thread::yield();
        counter = seen + 1;
      }
    });
  for (std::thread& thread : threads) thread.join();
  CHECK(counter == kThreads * kEach);
}

TEST_CASE("the shard lock: a waiter sleeps while the holder keeps it, and gets it when it is free") {
  FutexMutex mutex;
  mutex.lock();
  constexpr int kWaiters = 4;
  std::atomic<int> started{0};
  std::atomic<int> acquired{0};
  std::vector<double> cpu(kWaiters, 0.0);
  std::vector<std::thread> waiters;
  for (int w = 0; w < kWaiters; ++w)
    waiters.emplace_back([&, w] {
      const double before = thread_cpu_seconds();
      started.fetch_add(1);
      mutex.lock();
      cpu[static_cast<std::size_t>(w)] = thread_cpu_seconds() - before;
      acquired.fetch_add(1);
      mutex.unlock();
    });
  while (started.load() < kWaiters) std::this_thread::yield();
  // Held for 300 ms, as a device call under the lock might be.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(acquired.load() == 0);
  mutex.unlock();
  for (std::thread& waiter : waiters) waiter.join();
  CHECK(acquired.load() == kWaiters);
  // Spinning through 300 ms would cost each waiter about 300 ms of CPU; a
  // sleeper wakes at most every 0.1 ms, then less and less often (2 ms),
  // a few microseconds of CPU each time.
  for (double seconds : cpu) CHECK(seconds < 0.15);
  // And try_lock fails while held, succeeds when free.
  mutex.lock();
  std::thread other([&] { CHECK_FALSE(mutex.try_lock()); });
  other.join();
  mutex.unlock();
  CHECK(mutex.try_lock());
  mutex.unlock();
}

#if defined(__linux__) && defined(__LP64__)
TEST_CASE("the shard lock: unlock wakes a sleeping waiter (its sleeps here are 10 s: only the wake ends one early)") {
  using cachealloc::detail::BasicFutexMutex;
  BasicFutexMutex<10'000'000'000, 10'000'000'000> mutex;
  mutex.lock();
  std::atomic<bool> got{false};
  std::chrono::steady_clock::time_point acquired_at;
  std::thread waiter([&] {
    mutex.lock();
    acquired_at = std::chrono::steady_clock::now();
    got = true;
    mutex.unlock();
  });
  // Long enough for the waiter to spin out and fall asleep.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK_FALSE(got.load());
  const auto released_at = std::chrono::steady_clock::now();
  mutex.unlock();
  waiter.join();
  const double seconds = std::chrono::duration<double>(acquired_at - released_at).count();
  // A woken waiter runs within milliseconds; without the wake it would
  // sleep out its 10 s.
  CHECK(seconds < 2.0);
}
#endif

TEST_CASE("the shard lock hands over between two threads in strict turns, and the run ends") {
  // Each thread takes the lock until it is its turn, so the lock changes
  // hands at every turn and waiters go to sleep and are woken all the time:
  // the window where an unlock misses a sleeper comes up as often as it can.
  // A missed wake costs the sleeper its timeout, never the run; a watchdog
  // fails the test rather than letting it hang.
  FutexMutex mutex;
  constexpr long kTurns = 100'000;
  long turn = 0;  // even: thread 0's, odd: thread 1's; under the lock
  long handed = 0;
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 1200 && !done.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!done.load()) {
      std::fprintf(stderr, "test_shard_mutex: strict turns still running after 120 s: a waiter is stranded\n");
      std::abort();
    }
  });
  auto worker = [&](long me) {
    for (long mine = 0; mine < kTurns;) {
      std::lock_guard lock(mutex);
      if ((turn & 1) != me) continue;
      ++turn;
      ++handed;
      ++mine;
    }
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  done = true;
  watchdog.join();
  CHECK(turn == 2 * kTurns);
  CHECK(handed == 2 * kTurns);
}
