// What-if replay throughput (issue 16): events per second of replay_allocator
// on one core, over a snapshot already in memory (no decoding), reported for
// the whole call (the recorded-figures pass plus the replay through the
// allocator) and per pass. Usage: bench_replay_throughput FILE [REPEATS]
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "cachealloc/analyzer/allocator_replay.hpp"
#include "cachealloc/analyzer/load.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_replay_throughput FILE [REPEATS]\n");
    return 2;
  }
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 3;
  const auto snapshot = cachealloc::analyzer::load(argv[1]);
  double best = 1e300;
  cachealloc::analyzer::ReplayResult result;
  for (int i = 0; i < repeats; ++i) {
    cachealloc::analyzer::SnapshotEvents source(snapshot);
    const auto start = std::chrono::steady_clock::now();
    result = cachealloc::analyzer::replay_allocator(source);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds < best) best = seconds;
  }
  const double events = static_cast<double>(snapshot.events.size());
  std::printf("%s: %.0f events, best of %d: %.3f s, %.2f M events/s (two passes: recorded figures + replay), "
              "%llu requests, peak reserved %llu (recorded %llu)\n",
              argv[1], events, repeats, best, events / best / 1e6, static_cast<unsigned long long>(result.requests),
              static_cast<unsigned long long>(result.replayed.peak_reserved),
              static_cast<unsigned long long>(result.recorded.peak_reserved));
  return 0;
}
