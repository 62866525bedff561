// The best wall time of three runs of a piece of work, for the analyzer's
// benchmarks (analyze_throughput.cpp, pickle_phases.cpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>

namespace cachealloc::bench {

inline double seconds_best_of_3(const std::function<void()>& run) {
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count());
  }
  return best;
}

}  // namespace cachealloc::bench
