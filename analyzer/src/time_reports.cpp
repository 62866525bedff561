// timeline and events: what happened when.
#include <algorithm>

#include "cachealloc/analyzer/reports.hpp"
#include "report_helpers.hpp"

namespace cachealloc::analyzer {

using snapshot::Snapshot;

Document timeline_report(EventSource& source, const ReportOptions& options) {
  const Snapshot& snapshot = source.head();
  AnalysisOptions analysis = detail::analysis_options(options);
  analysis.timeline = options.buckets != 0 ? AnalysisOptions::Timeline::buckets : AnalysisOptions::Timeline::per_event;
  analysis.buckets = options.buckets;
  const Analysis a = analyze(source, analysis);
  const bool bucketed = options.buckets != 0;

  Document doc;
  doc.report = "timeline";
  doc.title = detail::title(snapshot, a.device, "timeline");
  Table& table = doc.table("timeline",
                           bucketed ? "largest value in each of " + std::to_string(a.timeline.size() - 1) + " slices"
                                    : "after each event",
                           {{"first_event", "from", Unit::event},
                            {"event", "to", Unit::event},
                            {"time_ns", "time", Unit::time},
                            {"kind", "kind"},
                            {"allocated", "allocated", Unit::bytes},
                            {"reserved", "reserved", Unit::bytes},
                            {"active", "active", Unit::bytes},
                            {"requested", "requested", Unit::bytes},
                            {"peak", "peak"}});
  // A peak belongs to the row whose range holds its event; the start row has none.
  auto holds = [](const TimelineRow& row, std::size_t event) {
    if (row.last_event == kNoEvent) return event == kNoEvent;
    return event != kNoEvent && event >= row.first_event && event <= row.last_event;
  };
  bool marked[4] = {false, false, false, false};
  for (const TimelineRow& row : a.timeline) {
    std::string peaks;
    const Peak* all[4] = {&a.peak_allocated, &a.peak_reserved, &a.peak_active, &a.peak_requested};
    static constexpr const char* kNames[4] = {"allocated", "reserved", "active", "requested"};
    for (int m = 0; m < 4; ++m) {
      if (!marked[m] && holds(row, all[m]->event)) {
        marked[m] = true;
        if (!peaks.empty()) peaks += ' ';
        peaks += kNames[m];
      }
    }
    const bool start = row.last_event == kNoEvent;
    table.rows.push_back({start ? Value{} : detail::event_value(row.first_event), detail::event_value(row.last_event),
                          detail::since_origin(a, row.time_ns),
                          start ? std::string("start") : bucketed ? std::string() : std::string(snapshot::to_string(row.kind)),
                          row.max.allocated, row.max.reserved, row.max.active, row.max.requested, peaks});
  }
  detail::add_common_notes(doc, snapshot, a);
  return doc;
}

Document events_report(EventSource& source, const ReportOptions& options) {
  const Snapshot& snapshot = source.head();
  SiteNamer names(snapshot, options.sites);
  const Analysis a = analyze(source, detail::analysis_options(options));
  Document doc;
  doc.report = "events";
  doc.title = detail::title(snapshot, a.device, "events");
  Table& table = doc.table("events", "events",
                           {{"event", "event", Unit::event},
                            {"time_ns", "time", Unit::time},
                            {"kind", "kind"},
                            {"address", "address", Unit::address},
                            {"size", "size", Unit::bytes},
                            {"aux", "aux", Unit::count},
                            {"stream", "stream", Unit::address},
                            {"thread", "thread", Unit::count},
                            {"site", "site"}});
  std::size_t shown = 0;
  // Returns false once the listing is full.
  auto list = [&](std::size_t i, const snapshot::Event& e) {
    const bool annotation =
        e.kind == snapshot::EventKind::annotation_begin || e.kind == snapshot::EventKind::annotation_end;
    if (e.device != a.device && !annotation) return true;
    if (!options.kinds.empty() && std::find(options.kinds.begin(), options.kinds.end(), e.kind) == options.kinds.end())
      return true;
    if (options.limit != 0 && shown == options.limit) {
      doc.notes.push_back("listing stops at " + std::to_string(options.limit) + " events (--limit)");
      return false;
    }
    ++shown;
    Value aux = e.aux;
    if (annotation && e.aux < snapshot.strings.size()) aux = snapshot.strings[e.aux];
    table.rows.push_back({static_cast<std::uint64_t>(i), detail::since_origin(a, e.time_ns),
                          std::string(snapshot::to_string(e.kind)), e.address, e.size, aux, e.stream,
                          static_cast<std::uint64_t>(e.thread), e.stack ? Value{names.site(e.stack)} : Value{}});
    return true;
  };
  bool more = true;
  for (std::size_t b = 0; more && b < source.block_count() && source.block_begin(b) < a.window.end; ++b) {
    const std::size_t base = source.block_begin(b);
    if (source.block_begin(b + 1) <= a.window.begin) continue;
    const std::span<const snapshot::Event> events = source.block(b);
    const std::size_t from = a.window.begin > base ? a.window.begin - base : 0;
    const std::size_t to = std::min(events.size(), a.window.end - base);
    for (std::size_t j = from; more && j < to; ++j) more = list(base + j, events[j]);
  }
  detail::add_common_notes(doc, snapshot, a);
  return doc;
}

Document timeline_report(const Snapshot& snapshot, const ReportOptions& options) {
  SnapshotEvents source(snapshot);
  return timeline_report(source, options);
}

Document events_report(const Snapshot& snapshot, const ReportOptions& options) {
  SnapshotEvents source(snapshot);
  return events_report(source, options);
}

}  // namespace cachealloc::analyzer
