// Shared pieces of the report builders; private to analyzer/.
#pragma once

#include <string>

#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/document.hpp"
#include "cachealloc/analyzer/reports.hpp"

namespace cachealloc::analyzer::detail {

AnalysisOptions analysis_options(const ReportOptions& options);

// "<program> (pid N), device D (name)": the first line of every table report.
std::string title(const snapshot::Snapshot& snapshot, std::int32_t device, const std::string& what);

// The moment a report's "now" describes: "after event #N (the dump)" (or "(the last one
// read)" for a stream that lost its trailer),
// "after event #N" for a window that ends earlier, "before the first event".
std::string moment(const snapshot::Snapshot& snapshot, const Analysis& analysis);

// Whether the file's recorder writes events of `kind`, so that a count of
// none means none happened. PyTorch's trace (TraceEntry::Action) has no
// split, merge or empty_cache entry; our recorder writes no snapshot entry.
// A count of a kind not recorded is unknown, never 0.
bool records_kind(const snapshot::Snapshot& snapshot, snapshot::EventKind kind);
// Whether the file counts the events its ring dropped: ours does; PyTorch's
// ring drops its oldest entries without a count.
bool counts_dropped_events(const snapshot::Snapshot& snapshot);
// A stream (format version 7) that dropped events while it was written
// (when_full=drop): they are missing anywhere in the run, not before its
// first event as a ring's are.
bool dropped_mid_stream(const snapshot::Snapshot& snapshot);

// Warnings every report shares: ring overflow and lower bounds, anomalies,
// a replayed layout that disagrees with the stored one, a partial window.
void add_common_notes(Document& document, const snapshot::Snapshot& snapshot, const Analysis& analysis);

inline Value event_value(std::size_t event) {
  return event == kNoEvent ? Value{} : Value{static_cast<std::uint64_t>(event)};
}
inline std::uint64_t since_origin(const Analysis& analysis, std::uint64_t time_ns) {
  return time_ns > analysis.time_origin_ns ? time_ns - analysis.time_origin_ns : 0;
}
inline std::size_t listed(std::size_t available, std::size_t limit) {
  return limit == 0 ? available : std::min(available, limit);
}

}  // namespace cachealloc::analyzer::detail
