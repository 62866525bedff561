// segments and fragmentation: how the reserved memory is laid out.
#include <algorithm>

#include "cachealloc/analyzer/reports.hpp"
#include "reports/report_helpers.hpp"

namespace cachealloc::analyzer {

using snapshot::BlockState;
using snapshot::Segment;
using snapshot::Snapshot;

namespace {

constexpr std::size_t kPageMapWidth = 64;
constexpr std::size_t kDefaultFragmentationBuckets = 20;

char state_char(BlockState state) {
  switch (state) {
    case BlockState::active_allocated: return '#';
    case BlockState::active_pending_free: return '+';
    case BlockState::inactive: return '.';
    case BlockState::unmapped: return ' ';
  }
  return '?';
}

// One character per 1/64 of the segment: the state holding most of its bytes.
std::string page_map(const Segment& segment) {
  std::string map(kPageMapWidth, ' ');
  if (segment.total_size == 0) return map;
  const double cell = static_cast<double>(segment.total_size) / kPageMapWidth;
  std::size_t b = 0;
  for (std::size_t c = 0; c < kPageMapWidth; ++c) {
    const double begin = static_cast<double>(segment.address) + cell * static_cast<double>(c);
    const double end = begin + cell;
    double best = -1;
    while (b < segment.blocks.size() &&
           static_cast<double>(segment.blocks[b].address + segment.blocks[b].size) <= begin)
      ++b;
    for (std::size_t k = b; k < segment.blocks.size() && static_cast<double>(segment.blocks[k].address) < end; ++k) {
      const double lo = std::max(begin, static_cast<double>(segment.blocks[k].address));
      const double hi = std::min(end, static_cast<double>(segment.blocks[k].address + segment.blocks[k].size));
      if (hi - lo > best) {
        best = hi - lo;
        map[c] = state_char(segment.blocks[k].state);
      }
    }
  }
  return '|' + map + '|';
}

}  // namespace

Document segments_report(EventSource& source, const ReportOptions& options) {
  const Snapshot& snapshot = source.head();
  SiteNamer names(snapshot, options.sites);
  AnalysisOptions analysis = detail::analysis_options(options);
  std::vector<Segment> layout;
  std::vector<SegmentFigures> figures;
  auto capture = [&](const Replay& replay) {
    layout = replay.layout();
    figures = replay.segment_figures();
  };
  if (options.at) analysis.window.end = std::min(*options.at + 1, source.event_count());
  analysis.at_end = capture;
  const Analysis a = analyze(source, analysis);

  Document doc;
  doc.report = "segments";
  const std::string when =
      a.window.end == 0 ? std::string("before the first event") : "after event #" + std::to_string(a.window.end - 1);
  doc.title = detail::title(snapshot, a.device, "segments " + when);
  doc.text("legend", "").lines.push_back("page map: # allocated  + pending free  . free (cached)  ' ' unmapped");
  Table& segments = doc.table("segments", std::to_string(layout.size()) + " segments",
                              {{"address", "address", Unit::address},
                               {"size", "size", Unit::bytes},
                               {"reserved", "reserved", Unit::bytes},
                               {"allocated", "allocated", Unit::bytes},
                               {"cached_free", "cached free", Unit::bytes},
                               {"largest_free", "largest free", Unit::bytes},
                               {"blocks", "blocks", Unit::count},
                               {"pool", "pool"},
                               {"stream", "stream", Unit::address},
                               {"page_map", "page map"}});
  Table& blocks = doc.table("blocks", "blocks in address order",
                            {{"segment", "segment", Unit::address},
                             {"address", "address", Unit::address},
                             {"offset", "offset", Unit::bytes},
                             {"state", "state"},
                             {"size", "size", Unit::bytes},
                             {"requested", "requested", Unit::bytes, "-"},  // a free block has none
                             {"site", "site", Unit::none, "-"}});
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const Segment& s = layout[i];
    const SegmentFigures& f = figures[i];
    segments.rows.push_back({s.address, s.total_size, f.reserved, f.allocated, f.inactive, f.largest_free,
                             static_cast<std::uint64_t>(s.blocks.size()),
                             std::string(s.expandable ? "expandable" : s.large_pool ? "large" : "small"), s.stream,
                             page_map(s)});
    for (const snapshot::Block& b : s.blocks) {
      const bool active = b.state == BlockState::active_allocated || b.state == BlockState::active_pending_free;
      blocks.rows.push_back({s.address, b.address, b.address - s.address, std::string(snapshot::to_string(b.state)),
                             b.size, active ? Value{b.requested} : Value{},
                             active ? Value{names.site(b.stack)} : Value{}});
    }
  }
  detail::add_common_notes(doc, snapshot, a);
  return doc;
}

Document fragmentation_report(EventSource& source, const ReportOptions& options) {
  const Snapshot& snapshot = source.head();
  AnalysisOptions analysis = detail::analysis_options(options);
  analysis.timeline = AnalysisOptions::Timeline::buckets;
  analysis.buckets = options.buckets != 0 ? options.buckets : kDefaultFragmentationBuckets;
  analysis.sample_fragmentation = true;
  std::vector<SegmentFigures> figures;
  analysis.at_end = [&](const Replay& replay) { figures = replay.segment_figures(); };
  const Analysis a = analyze(source, analysis);

  Document doc;
  doc.report = "fragmentation";
  doc.title = detail::title(snapshot, a.device, "fragmentation");
  doc.csv_table = "over_time";
  const CacheFigures& f = a.cache_at_end;
  doc.group("", "overall, " + detail::moment(snapshot, a))
      .add("reserved", "reserved", a.totals_at_end.reserved, Unit::bytes)
      .add("allocated", "allocated", a.totals_at_end.allocated, Unit::bytes)
      .add("requested", "requested", a.totals_at_end.requested, Unit::bytes)
      .add("rounding_waste", "rounding waste (active - requested)", f.rounding_waste, Unit::bytes)
      .add("pending_free", "pending frees", f.pending_free, Unit::bytes)
      .add("cached_free", "cached free", f.cached_free, Unit::bytes)
      .add("inactive_split", "inactive split", f.inactive_split, Unit::bytes)
      .add("releasable_by_empty_cache", "releasable by empty_cache", f.releasable, Unit::bytes)
      .add("largest_free_block", "largest free block", f.largest_free, Unit::bytes)
      .add("external_fragmentation", "external fragmentation (1 - largest free block / cached free)",
           f.external_fragmentation(), Unit::ratio);

  Table& per_segment = doc.table("segments", "per segment, " + detail::moment(snapshot, a),
                                 {{"address", "address", Unit::address},
                                  {"reserved", "reserved", Unit::bytes},
                                  {"allocated", "allocated", Unit::bytes},
                                  {"rounding_waste", "rounding waste", Unit::bytes},
                                  {"cached_free", "cached free", Unit::bytes},
                                  {"largest_free", "largest free", Unit::bytes},
                                  {"external_fragmentation", "external", Unit::ratio},
                                  {"inactive_split", "inactive split", Unit::bytes},
                                  {"releasable_by_empty_cache", "releasable", Unit::bytes}});
  for (const SegmentFigures& s : figures) {
    // As PyTorch counts inactive_split: free bytes beside an active block,
    // expandable segments left out.
    const bool held = s.active_blocks != 0;
    per_segment.rows.push_back({s.address, s.reserved, s.allocated, s.active - s.requested, s.inactive,
                                s.largest_free, s.external_fragmentation(), held && !s.expandable ? s.inactive : 0,
                                s.releasable});
  }

  Table& over_time = doc.table("over_time", "over time (state at the end of each slice)",
                               {{"event", "event", Unit::event},
                                {"time_ns", "time", Unit::time},
                                {"reserved", "reserved", Unit::bytes},
                                {"allocated", "allocated", Unit::bytes},
                                {"requested", "requested", Unit::bytes},
                                {"rounding_waste", "rounding waste", Unit::bytes},
                                {"pending_free", "pending frees", Unit::bytes},
                                {"cached_free", "cached free", Unit::bytes},
                                {"inactive_split", "inactive split", Unit::bytes},
                                {"releasable_by_empty_cache", "releasable", Unit::bytes},
                                {"largest_free", "largest free", Unit::bytes},
                                {"external_fragmentation", "external", Unit::ratio}});
  for (const TimelineRow& row : a.timeline) {
    const CacheFigures c = row.cache.value_or(CacheFigures{});
    over_time.rows.push_back({detail::event_value(row.last_event), detail::since_origin(a, row.time_ns),
                              row.at_end.reserved, row.at_end.allocated, row.at_end.requested, c.rounding_waste,
                              c.pending_free, c.cached_free, c.inactive_split, c.releasable, c.largest_free,
                              c.external_fragmentation()});
  }
  detail::add_common_notes(doc, snapshot, a);
  return doc;
}

Document segments_report(const Snapshot& snapshot, const ReportOptions& options) {
  SnapshotEvents source(snapshot);
  return segments_report(source, options);
}

Document fragmentation_report(const Snapshot& snapshot, const ReportOptions& options) {
  SnapshotEvents source(snapshot);
  return fragmentation_report(source, options);
}

}  // namespace cachealloc::analyzer
