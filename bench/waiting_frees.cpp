// What-if replay with many frees waiting for other streams (record_stream):
// wall time of replay_allocator for N waiting frees, N doubling, completed
// in the order requested (one queue) and with the second half reversed
// (N/2 queues, the allocator walks each on every request). Linear replay
// keeps time per event flat as N grows in the first case.
// Usage: bench_waiting_frees [LARGEST_N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "args.hpp"
#include "guarded.hpp"
#include "cachealloc/analyzer/allocator_replay.hpp"
#include "../analyzer/testing/trace_builder.hpp"

namespace {

int run(std::uint64_t largest) {
  std::printf("%-22s %10s %10s %8s %10s %14s\n", "completion order", "waiting", "events", "queues", "seconds",
              "ns per event");
  for (const bool reversed : {false, true}) {
    for (std::uint64_t n = 12'500; n <= largest; n *= 2) {
      const auto snapshot = cachealloc::analyzer::testing::waiting_frees_trace(n, reversed);
      double best = 1e300;
      cachealloc::analyzer::ReplayResult result;
      for (int repeat = 0; repeat < (reversed ? 1 : 3); ++repeat) {
        cachealloc::analyzer::SnapshotEvents source(snapshot);
        const auto start = std::chrono::steady_clock::now();
        result = cachealloc::analyzer::replay_allocator(source);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
      std::printf("%-22s %10llu %10zu %8llu %10.3f %14.1f\n", reversed ? "second half reversed" : "as requested",
                  static_cast<unsigned long long>(result.deferred_frees), snapshot.events.size(),
                  static_cast<unsigned long long>(result.deferred_queues), best,
                  best * 1e9 / static_cast<double>(snapshot.events.size()));
      std::fflush(stdout);
      if (reversed && best > 10) break;  // quadratic in the queues: enough to show the slope
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const cachealloc::bench::Args args(argc, argv, "[LARGEST_N]", 1);
  const auto largest = args.count<std::uint64_t>(1, 100'000, 1, 100'000'000, "LARGEST_N");
  return cachealloc::bench::guarded(args, [&] { return run(largest); });
}
