// libFuzzer target: the analysis behind every report. Whatever load()
// accepts (our format or a pickle), every report is built and rendered in
// every format, the flame graph and the Perfetto trace are written; JSON and
// CSV must be valid UTF-8, tables without a control character and every
// table row as long as its columns (fuzz_support.hpp). A refusal must be a
// SnapshotError of one line.
#include <cstddef>
#include <cstdint>
#include <span>
#include <sstream>

#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/reports.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/load.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace cachealloc;

void analyze(const snapshot::Snapshot& snapshot) {
  analyzer::ReportOptions options;
  analyzer::ReportOptions bucketed;
  bucketed.buckets = 7;
  using Report = analyzer::Document (*)(const snapshot::Snapshot&, const analyzer::ReportOptions&);
  for (const Report report : {static_cast<Report>(analyzer::summary_report), static_cast<Report>(analyzer::segments_report),
                              static_cast<Report>(analyzer::fragmentation_report),
                              static_cast<Report>(analyzer::timeline_report), static_cast<Report>(analyzer::peak_report),
                              static_cast<Report>(analyzer::top_report), static_cast<Report>(analyzer::leaks_report),
                              static_cast<Report>(analyzer::oom_report), static_cast<Report>(analyzer::events_report)}) {
    fuzz::render_all(report(snapshot, options));
  }
  fuzz::render_all(analyzer::timeline_report(snapshot, bucketed));
  fuzz::render_all(analyzer::fragmentation_report(snapshot, bucketed));
  for (const analyzer::ExportTable table : {analyzer::ExportTable::timeline, analyzer::ExportTable::events,
                                            analyzer::ExportTable::segments, analyzer::ExportTable::sites}) {
    fuzz::render_all(analyzer::export_report(snapshot, table, options));
  }
  analyzer::SnapshotEvents source(snapshot);
  std::ostringstream out;
  const analyzer::FlameGraph graph = analyzer::flame_graph(source, options, analyzer::FlameOptions{});
  analyzer::write_flame_svg(graph, out);
  fuzz::check_utf8(out.str());
  analyzer::write_collapsed(graph, out);
  std::ostringstream trace;
  analyzer::write_perfetto_trace(source, options, 16, trace);
  fuzz::check_utf8(trace.str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    analyze(snapshot::load(bytes));
  } catch (const snapshot::SnapshotError& error) {
    fuzz::check_message(error.what());
  }
  return 0;
}
