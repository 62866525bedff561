// Where the time of `cachealloc-analyze summary` on a PyTorch pickle goes:
// reading it (the pickle parse and the mapping to our events, FileEvents's
// constructor), then the one-pass analysis on one thread and on all cores
// (AnalysisOptions::threads). Best of 3 of each, in one process; results in
// docs/PERFORMANCE.md.
//
//   bench_pickle_phases BIG.pickle [ANALYSIS_THREADS]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>

#include "best_of.hpp"
#include "guarded.hpp"
#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/snapshot/detail/cores.hpp"

using namespace cachealloc;
using bench::seconds_best_of_3;

namespace {

volatile std::uint64_t g_sink = 0;

analyzer::AnalysisOptions summary_options(unsigned threads) {
  analyzer::AnalysisOptions options;
  options.threads = threads;
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Args args(argc, argv, "PICKLE [ANALYSIS_THREADS]", 2);
  if (!args.has(1)) args.fail("a pickle is needed");
  const unsigned threads = args.count<unsigned>(2, snapshot::detail::usable_cores(), 1, 1024, "ANALYSIS_THREADS");
  return bench::guarded(args, [&] {
    std::unique_ptr<analyzer::FileEvents> source;
    const double reading = seconds_best_of_3([&] {
      source.reset();
      source = std::make_unique<analyzer::FileEvents>(argv[1]);
    });
    const double events = static_cast<double>(source->event_count());
    unsigned ran_on = 0;
    const double serial =
        seconds_best_of_3([&] { g_sink = g_sink + analyzer::analyze(*source, summary_options(1)).peak_allocated.bytes; });
    const double parallel = seconds_best_of_3([&] {
      const analyzer::Analysis a = analyzer::analyze(*source, summary_options(threads));
      ran_on = a.threads;
      g_sink = g_sink + a.peak_allocated.bytes;
    });
    std::printf("%s: %.0f events, %zu blocks, streamed: %s\n", argv[1], events, source->block_count(),
                source->streaming() ? "yes" : "no");
    std::printf("%-44s %8.3f s\n", "read (parse + map to events)", reading);
    std::printf("%-44s %8.3f s  %6.1f M events/s\n", "analysis, one thread", serial, events / serial / 1e6);
    std::printf("%-44s %8.3f s  %6.1f M events/s\n",
                ("analysis, " + std::to_string(ran_on) + " threads (asked " + std::to_string(threads) + ")").c_str(),
                parallel, events / parallel / 1e6);
    return 0;
  });
}
