// Setting sweep scaling with cores: wall time of sweep() over the
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
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "guarded.hpp"
#include "cachealloc/analyzer/load.hpp"
#include "cachealloc/analyzer/sweep.hpp"
#include "cachealloc/snapshot/detail/cores.hpp"

namespace {

int run(const char* path, cachealloc::analyzer::SweepOptions options, const std::vector<unsigned>& counts) {
  const auto snapshot = cachealloc::analyzer::load(path);
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
                path, snapshot.events.size(), replays, result.threads, seconds, cpu,
                static_cast<double>(replays) / seconds, first / seconds,
                result.ranked.front().changes.empty() ? "(recorded)" : result.ranked.front().changes.c_str(),
                static_cast<unsigned long long>(result.ranked.front().figures.peak_reserved));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const cachealloc::bench::Args args(argc, argv, "FILE [CAPACITY_BYTES (0: the recorded cap)] [THREADS...]", 64);
  if (!args.has(1)) args.fail("a snapshot is needed");
  cachealloc::analyzer::SweepOptions options;
  if (const auto capacity = args.count<std::uint64_t>(2, 0, 0, std::uint64_t{1} << 60, "CAPACITY_BYTES"); capacity > 0)
    options.capacity = capacity;
  std::vector<unsigned> counts;
  for (int i = 3; args.has(i); ++i) counts.push_back(args.count<unsigned>(i, 1, 1, 1024, "THREADS"));
  if (counts.empty()) {
    const unsigned cores = cachealloc::snapshot::detail::usable_cores();
    for (unsigned t = 1; t < cores; t *= 2) counts.push_back(t);
    counts.push_back(cores);
  }
  return cachealloc::bench::guarded(args, [&] { return run(argv[1], options, counts); });
}
