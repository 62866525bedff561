// What-if replay throughput: events per second of replay_allocator
// on one core, over a snapshot already in memory (no decoding), for the whole
// call (the recorded-figures pass plus the replay through the allocator).
// Reports the best wall time and the best CPU time of the calling thread: on
// a shared machine the wall time also counts the slices other processes
// took from the core, the CPU time does not.
// Usage: bench_replay_throughput FILE [REPEATS]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "guarded.hpp"
#include "cachealloc/analyzer/allocator_replay.hpp"
#include "cachealloc/analyzer/load.hpp"

namespace {

double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

int run(const char* path, int repeats) {
  const auto snapshot = cachealloc::analyzer::load(path);
  double best = 1e300, best_cpu = 1e300;
  cachealloc::analyzer::ReplayResult result;
  for (int i = 0; i < repeats; ++i) {
    cachealloc::analyzer::SnapshotEvents source(snapshot);
    const double cpu_start = thread_cpu_seconds();
    const auto start = std::chrono::steady_clock::now();
    result = cachealloc::analyzer::replay_allocator(source);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double cpu = thread_cpu_seconds() - cpu_start;
    if (seconds < best) best = seconds;
    if (cpu < best_cpu) best_cpu = cpu;
  }
  const double events = static_cast<double>(snapshot.events.size());
  std::printf("%s: %.0f events, best of %d: %.3f s wall, %.2f M events/s; %.3f s CPU, %.2f M events/s "
              "(two passes: recorded figures + replay), %llu requests, peak reserved %llu (recorded %llu), "
              "fragmentation at peak %.6f (recorded %.6f)\n",
              path, events, repeats, best, events / best / 1e6, best_cpu, events / best_cpu / 1e6,
              static_cast<unsigned long long>(result.requests),
              static_cast<unsigned long long>(result.replayed.peak_reserved),
              static_cast<unsigned long long>(result.recorded.peak_reserved), result.replayed.fragmentation_at_peak,
              result.recorded.fragmentation_at_peak);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const cachealloc::bench::Args args(argc, argv, "FILE [REPEATS]", 2);
  if (!args.has(1)) args.fail("a snapshot is needed");
  const int repeats = args.count<int>(2, 3, 1, 1000, "REPEATS");
  return cachealloc::bench::guarded(args, [&] { return run(argv[1], repeats); });
}
