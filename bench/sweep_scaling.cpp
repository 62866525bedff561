// Setting sweep scaling with cores (issue 16): wall time of sweep() over the
// same grid with 1, 2, ... N threads (each replay its own allocator and
// simulated device), over a snapshot already in memory. Usage:
//   bench_sweep_scaling FILE [CAPACITY_BYTES] [THREADS...]
// Without THREADS: 1, 2, 4, ... up to the hardware concurrency. Prints one
// line per thread count: seconds, replays/s, the speed-up over 1 thread and
// the top point, which must be the same on every line. The process's CPU
// time beside the wall time shows what a loaded machine withheld.
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cachealloc/analyzer/load.hpp"
#include "cachealloc/analyzer/sweep.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_sweep_scaling FILE [CAPACITY_BYTES] [THREADS...]\n");
    return 2;
  }
  const auto snapshot = cachealloc::analyzer::load(argv[1]);
  cachealloc::analyzer::SweepOptions options;
  if (argc > 2 && std::atoll(argv[2]) > 0) options.capacity = std::strtoull(argv[2], nullptr, 10);
  std::vector<unsigned> counts;
  for (int i = 3; i < argc; ++i) counts.push_back(static_cast<unsigned>(std::atoi(argv[i])));
  if (counts.empty()) {
    const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
    for (unsigned t = 1; t < hardware; t *= 2) counts.push_back(t);
    counts.push_back(hardware);
  }
  double first = 0;
  for (const unsigned threads : counts) {
    options.threads = threads;
    cachealloc::analyzer::SnapshotEvents source(snapshot);
    const auto start = std::chrono::steady_clock::now();
    const std::clock_t cpu_start = std::clock();
    const auto result = cachealloc::analyzer::sweep(source, options);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double cpu = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
    if (first == 0) first = seconds;
    const std::size_t replays = result.ranked.size() + 1;
    std::printf("%s: %zu events, %zu replays, %u threads: %.3f s (process CPU %.3f s), %.2f replays/s, %.2fx over the first line; "
                "top: %s (peak reserved %llu)\n",
                argv[1], snapshot.events.size(), replays, result.threads, seconds, cpu,
                static_cast<double>(replays) / seconds, first / seconds,
                result.ranked.front().changes.empty() ? "(recorded)" : result.ranked.front().changes.c_str(),
                static_cast<unsigned long long>(result.ranked.front().figures.peak_reserved));
  }
  return 0;
}
