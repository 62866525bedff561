// Throughput of the one-pass analysis (summary, peak and fragmentation) on a
// generated 3M-event trace. Skipped by default because it measures the
// machine as much as the code; run with --no-skip. The target is 30M events/s
// on one core in a RelWithDebInfo build.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>

#include "../analyzer/testing/trace_builder.hpp"
#include "cachealloc/analyzer/analysis.hpp"

using namespace cachealloc;

TEST_CASE("one analysis pass over 3M events runs at 30M events/s or more" * doctest::skip()) {
  // given a generated 3M-event trace in memory
  const auto snap = analyzer::testing::random_trace(2024, 3'000'000, 64, 64);
  // when summary, peak and fragmentation figures are computed in one pass
  analyzer::AnalysisOptions options;
  options.timeline = analyzer::AnalysisOptions::Timeline::buckets;
  options.buckets = 100;
  options.sample_fragmentation = true;
  double best = 0;
  for (int run = 0; run < 3; ++run) {
    const auto start = std::chrono::steady_clock::now();
    const auto result = analyzer::analyze(snap, options);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(snap.events.size()) / seconds);
    CHECK(result.anomalies.total() == 0);
    CHECK(result.layout_check.differences == 0);
  }
  // then the rate reaches the target
  std::printf("analysis: %zu events, best of 3: %.1f M events/s\n", snap.events.size(), best / 1e6);
  CHECK(best >= 30e6);
}
