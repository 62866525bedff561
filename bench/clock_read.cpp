// bench_clock_read: what one clock read costs inside a lock's critical
// section, as the recorder reads it on every allocator call: RDTSC (the hot
// path's unordered read), RDTSCP (the ordered one), clock_gettime through
// the vDSO (CLOCK_MONOTONIC, and _COARSE). Each figure is the time over an
// uncontended lock+unlock alone, best of the rounds.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "args.hpp"

namespace {

std::atomic<int> g_lock{0};
volatile std::uint64_t g_sink;

template <class Read>
double ns_per_section(Read read, long count) {
  const auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < count; ++i) {
    int expected = 0;
    while (!g_lock.compare_exchange_weak(expected, 1, std::memory_order_acquire)) expected = 0;
    g_sink = read();
    g_lock.store(0, std::memory_order_release);
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() /
         static_cast<double>(count);
}

std::uint64_t gettime(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  const cachealloc::bench::Args args(argc, argv, "[sections per round] [rounds]", 2);
  const long count = args.count<long>(1, 5'000'000, 1, 10'000'000'000, "sections per round");
  const int rounds = args.count<int>(2, 5, 1, 1000, "rounds");
  struct Row {
    const char* name;
    double best = 1e300;
  } rows[] = {{"lock+unlock alone"}, {"+ RDTSC"}, {"+ RDTSCP"}, {"+ CLOCK_MONOTONIC"}, {"+ CLOCK_MONOTONIC_COARSE"}};
  for (int r = 0; r < rounds; ++r) {
    const double times[] = {
        ns_per_section([] { return std::uint64_t{1}; }, count),
#if defined(__x86_64__)
        ns_per_section([] { return static_cast<std::uint64_t>(__rdtsc()); }, count),
        ns_per_section([] { unsigned core; return static_cast<std::uint64_t>(__rdtscp(&core)); }, count),
#else
        0, 0,
#endif
        ns_per_section([] { return gettime(CLOCK_MONOTONIC); }, count),
        ns_per_section([] { return gettime(CLOCK_MONOTONIC_COARSE); }, count),
    };
    for (int i = 0; i < 5; ++i)
      if (times[i] < rows[i].best) rows[i].best = times[i];
  }
  std::printf("clock read inside a lock, %ld sections x %d rounds, best round\n", count, rounds);
  for (int i = 0; i < 5; ++i)
    std::printf("%-26s %7.1f ns%s\n", rows[i].name, i == 0 ? rows[0].best : rows[i].best - rows[0].best,
                i == 0 ? "" : " more");
  return 0;
}
