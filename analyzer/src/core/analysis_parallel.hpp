// The parallel analysis of a whole trace (AnalysisOptions::threads).
// Private to analyzer/src.
#pragma once

#include <functional>

#include "core/analysis_pass.hpp"
#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/event_source.hpp"

namespace cachealloc::analyzer::parallel {

// What the serial analysis does after its pass, given the state at the end
// and the per-site figures at the two peaks.
using Finish = std::function<void(Analysis&, Replay&, const pass::SitePeakTracker& at_peak_allocated,
                                  const pass::SitePeakTracker& at_peak_reserved)>;

// Analyzes every event of `source` from `initial` on `threads` threads into
// `a`, which holds what run_analysis set from the head and the window (the
// whole trace), then calls `finish`. Returns false, with `a` as it was,
// when the trace or the options are outside what the parallel pass covers
// (AnalysisOptions::threads), a thread cannot be had, or a range throws:
// the serial pass then gives the answer, or the error.
bool run(EventSource& source, const AnalysisOptions& options, const InitialLayout& initial, unsigned threads,
         Analysis& a, const Finish& finish);

}  // namespace cachealloc::analyzer::parallel
