// bench_history_overhead: what memory history costs per alloc+free pair on the
// cached path (4 KiB, one thread), side by side in one run: history off, on
// without stacks, on with native stacks, and both again with the coarse
// clock (HistoryClock::coarse). Each pair makes 5 events (split, alloc,
// free_requested, free_completed, merge) in two observer calls; only the
// alloc gets a stack.
//
// Rounds interleave the modes so that frequency changes and neighbours on a
// shared machine hit all three alike; each mode reports its best round.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "args.hpp"
#include "cachealloc/history.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Mode {
  const char* name;
  bool history;
  cachealloc::StackCapture stacks;
  cachealloc::HistoryClock clock = cachealloc::HistoryClock::precise;
};

// A few frames between main and the allocator, as in a real program.
__attribute__((noinline)) void pairs(cachealloc::CachingAllocator& allocator, long count) {
  for (long i = 0; i < count; ++i) {
    void* p = allocator.allocate(4096);
    asm volatile("" : : "r"(p) : "memory");
    allocator.deallocate(p);
  }
}

__attribute__((noinline)) double ns_per_pair(cachealloc::CachingAllocator& allocator, long count) {
  const auto start = Clock::now();
  pairs(allocator, count);
  const auto elapsed = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
  return elapsed / static_cast<double>(count);
}

}  // namespace

int main(int argc, char** argv) {
  const cachealloc::bench::Args args(argc, argv, "[pairs per round] [rounds]", 2);
  const long pairs_per_round = args.count<long>(1, 500'000, 1, 10'000'000'000, "pairs per round");
  const int rounds = args.count<int>(2, 9, 1, 1000, "rounds");
  const Mode modes[] = {
      {"history off", false, cachealloc::StackCapture::none},
      {"history on, no stacks", true, cachealloc::StackCapture::none},
      {"history on, native stacks", true, cachealloc::StackCapture::native},
      {"no stacks, coarse clock", true, cachealloc::StackCapture::none, cachealloc::HistoryClock::coarse},
      {"native stacks, coarse clock", true, cachealloc::StackCapture::native, cachealloc::HistoryClock::coarse},
  };
  std::vector<std::unique_ptr<cachealloc::CachingAllocator>> allocators;
  std::vector<std::unique_ptr<cachealloc::HistoryRecorder>> recorders;
  for (const Mode& mode : modes) {
    allocators.push_back(std::make_unique<cachealloc::CachingAllocator>(cachealloc::make_simulated_device()));
    allocators.back()->deallocate(allocators.back()->allocate(4096));  // the segment exists: cached path from here
    if (mode.history) {
      cachealloc::HistoryOptions options;
      options.stacks = mode.stacks;
      options.clock = mode.clock;
      options.max_entries = std::getenv("RING") ? std::strtoul(std::getenv("RING"), nullptr, 0) : 1u << 20;  // overflows: the steady state of a long run
      recorders.push_back(std::make_unique<cachealloc::HistoryRecorder>(*allocators.back(), options));
    }
  }
  std::vector<std::vector<double>> results(std::size(modes));
  // ONLY=m runs mode m alone (0 off, 1 no stacks, 2 native, 3 and 4 the
  // same with the coarse clock), for an
  // instruction count per mode under valgrind --tool=callgrind.
  const char* only = std::getenv("ONLY");
  for (int round = 0; round < rounds; ++round)
    for (std::size_t m = 0; m < std::size(modes); ++m)
      results[m].push_back(only && std::strtoul(only, nullptr, 10) != m ? 1.0
                                                                        : ns_per_pair(*allocators[m], pairs_per_round));

  std::printf("alloc+free pairs of 4 KiB on the cached path, one thread, %ld pairs x %d rounds\n", pairs_per_round,
              rounds);
  std::printf("%-28s %12s %12s %10s\n", "mode", "best ns/pair", "median", "vs off");
  double off = 0;
  for (std::size_t m = 0; m < std::size(modes); ++m) {
    std::vector<double>& r = results[m];
    std::sort(r.begin(), r.end());
    const double best = r.front();
    if (m == 0) off = best;
    std::printf("%-28s %12.1f %12.1f %9.2fx\n", modes[m].name, best, r[r.size() / 2], best / off);
  }
  return 0;
}
