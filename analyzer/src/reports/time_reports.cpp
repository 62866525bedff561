// timeline and events: what happened when.
#include <algorithm>
#include <memory>
#include <optional>

#include "cachealloc/analyzer/reports.hpp"
#include "reports/category_sections.hpp"
#include "reports/report_helpers.hpp"

namespace cachealloc::analyzer {

using snapshot::Snapshot;

namespace {

const std::vector<Column>& timeline_columns() {
  static const std::vector<Column> columns = {{"first_event", "from", Unit::event},
                                              {"event", "to", Unit::event},
                                              {"time_ns", "time", Unit::time},
                                              {"kind", "kind"},
                                              {"allocated", "allocated", Unit::bytes},
                                              {"reserved", "reserved", Unit::bytes},
                                              {"active", "active", Unit::bytes},
                                              {"requested", "requested", Unit::bytes},
                                              {"peak", "peak"}};
  return columns;
}

// A column per category, then where the categories came from.
std::vector<Column> timeline_columns_with_categories() {
  std::vector<Column> columns = timeline_columns();
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    const auto category = static_cast<Category>(c);
    columns.push_back({category_key(category), category_key(category), Unit::bytes});
  }
  columns.push_back({"category_source", "categories"});
  return columns;
}

void append_categories(std::vector<Value>& row, const CategoryBytes& bytes, const std::string& source) {
  for (const std::uint64_t b : bytes.bytes) row.emplace_back(b);
  row.emplace_back(source);
}

// One row per event, produced while rendering: the analysis (a first pass)
// finds the peaks; the rows come from a second replay from the same start,
// one event at a time, so memory is the replayed state, not the rows.
Document streamed_timeline(EventSource& source, const ReportOptions& options) {
  const Snapshot& snapshot = source.head();
  const Analysis a = analyze(source, detail::analysis_options(options));
  Document doc;
  doc.report = "timeline";
  doc.title = detail::title(snapshot, a.device, "timeline");
  auto categories = std::make_shared<const Categorization>(categorize(source, a.device, detail::from_start_of(a)));
  auto produce = [&source, a, categories](const RowSink& row, std::vector<std::string>& /*notes*/) {
    Categorization::Follower categories_now(*categories);
    const std::string category_source = detail::category_source(*categories);
    // The follower takes every event from the first; the rows start at the window.
    for_each_event(source, 0, a.window.begin, [&](std::size_t index, const snapshot::Event& e) {
      categories_now.on_event(index, e);
      return true;
    });
    std::optional<Replay> replay;
    replay_to(source, a.device, a.window.begin == 0 ? kNoEvent : a.window.begin - 1,
              [&replay](const Replay& state) { replay.emplace(state); });
    const Peak* peaks[4] = {&a.peak_allocated, &a.peak_reserved, &a.peak_active, &a.peak_requested};
    static constexpr const char* kNames[4] = {"allocated", "reserved", "active", "requested"};
    bool marked[4] = {false, false, false, false};
    auto marks = [&](std::size_t event) {
      std::string text;
      for (int m = 0; m < 4; ++m) {
        if (!marked[m] && peaks[m]->event == event) {
          marked[m] = true;
          text += (text.empty() ? "" : " ") + std::string(kNames[m]);
        }
      }
      return text;
    };
    auto emit = [&](Value first, std::size_t event, std::uint64_t time, std::string kind) {
      const Totals& t = replay->totals();
      std::vector<Value> cells = {std::move(first), detail::event_value(event), detail::since_origin(a, time),
                                  std::move(kind), t.allocated, t.reserved, t.active, t.requested, marks(event)};
      append_categories(cells, categories_now.now(), category_source);
      row(std::move(cells));
    };
    bool started = false;
    for_each_event(source, a.window.begin, a.window.end, [&](std::size_t index, const snapshot::Event& e) {
      if (!started) emit(Value{}, kNoEvent, e.time_ns, "start"), started = true;
      replay->apply(e);
      categories_now.on_event(index, e);
      emit(static_cast<std::uint64_t>(index), index, e.time_ns, std::string(snapshot::to_string(e.kind)));
      return true;
    });
    if (!started) emit(Value{}, kNoEvent, a.time_origin_ns, "start");
  };
  doc.streamed = StreamedTable{"timeline", "after each event", timeline_columns_with_categories(), produce};
  doc.notes.push_back(detail::category_note(detail::category_source(*categories)) + " Each row's categories are those after its event.");
  detail::add_common_notes(doc, snapshot, a);
  return doc;
}

}  // namespace

Document timeline_report(EventSource& source, const ReportOptions& options) {
  if (options.stream_rows && options.buckets == 0) return streamed_timeline(source, options);
  const Snapshot& snapshot = source.head();
  AnalysisOptions analysis = detail::analysis_options(options);
  analysis.timeline = options.buckets != 0 ? AnalysisOptions::Timeline::buckets : AnalysisOptions::Timeline::per_event;
  analysis.buckets = options.buckets;
  analysis.categories = true;
  analysis.category_changes = false;  // the rows' maxima only, which the walk sums
  const Analysis a = analyze(source, analysis);
  const bool bucketed = options.buckets != 0;

  Document doc;
  doc.report = "timeline";
  doc.title = detail::title(snapshot, a.device, "timeline");
  Table& table = doc.table("timeline",
                           bucketed ? "largest value in each of " + std::to_string(a.timeline.size() - 1) + " slices"
                                    : "after each event",
                           timeline_columns_with_categories());
  // The categories where allocated was largest in each row, so that they
  // add up to the row's allocated.
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  const std::size_t before_window = detail::state_after(a, kNoEvent);
  for (const TimelineRow& row : a.timeline) {
    if (row.last_event == kNoEvent) ranges.emplace_back(before_window, before_window);
    else ranges.emplace_back(row.first_event, row.last_event);
  }
  CategorizeOptions in_rows = detail::from_start_of(a);
  in_rows.allocated_max_ranges = ranges;
  in_rows.max_kept_changes = 0;  // the walk sums the rows itself
  const std::shared_ptr<const Categorization> categorized = detail::categories_of(source, a, in_rows);
  const Categorization& categories = *categorized;
  const std::string category_source = detail::category_source(categories);
  const std::vector<CategoryBytes> by_row = categories.at_allocated_max(ranges);
  std::size_t row_index = 0;
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
    std::vector<Value> cells = {start ? Value{} : detail::event_value(row.first_event), detail::event_value(row.last_event),
                                detail::since_origin(a, row.time_ns),
                                start ? std::string("start") : bucketed ? std::string() : std::string(snapshot::to_string(row.kind)),
                                row.max.allocated, row.max.reserved, row.max.active, row.max.requested, peaks};
    append_categories(cells, by_row[row_index++], category_source);
    table.rows.push_back(std::move(cells));
  }
  doc.notes.push_back(detail::category_note(detail::category_source(categories)) +
                      (bucketed ? " Each row's categories are those where allocated was largest in it."
                                : " Each row's categories are those after its event."));
  detail::add_common_notes(doc, snapshot, a);
  return doc;
}

namespace {

bool is_annotation(const snapshot::Event& e) {
  return e.kind == snapshot::EventKind::annotation_begin || e.kind == snapshot::EventKind::annotation_end;
}

// Calls `visit(index, event)` for the window's events of the device (and
// every annotation) of the kinds asked for, until it returns false.
template <class Visit>
void for_each_listed(EventSource& source, const Analysis& a, const ReportOptions& options, Visit&& visit) {
  for_each_event(source, a.window.begin, a.window.end, [&](std::size_t index, const snapshot::Event& e) {
    if (e.device != a.device && !is_annotation(e)) return true;
    if (!options.kinds.empty() && std::find(options.kinds.begin(), options.kinds.end(), e.kind) == options.kinds.end())
      return true;
    return static_cast<bool>(visit(index, e));
  });
}

// Events per slice of the window: how many of each kind, and the bytes
// allocated and freed; for a trace too long to list.
void add_event_buckets(Document& doc, EventSource& source, const Analysis& a, const ReportOptions& options) {
  const std::size_t window = a.window.end - a.window.begin;
  const std::size_t slices = std::max<std::size_t>(1, std::min(options.buckets, std::max<std::size_t>(window, 1)));
  Table& table = doc.table("events", "events in each of " + std::to_string(slices) + " slices",
                           {{"first_event", "from", Unit::event},
                            {"event", "to", Unit::event},
                            {"time_ns", "time", Unit::time, "-"},  // a slice with no event of this device
                            {"events", "events", Unit::count},
                            {"alloc", "alloc", Unit::count},
                            {"free", "free", Unit::count},
                            {"segment_alloc", "segment_alloc", Unit::count},
                            {"segment_release", "segment_release", Unit::count},
                            {"oom", "oom", Unit::count},
                            {"alloc_bytes", "alloc_bytes", Unit::bytes},
                            {"freed_bytes", "freed_bytes", Unit::bytes}});
  struct Slice {
    std::uint64_t events = 0, alloc = 0, free = 0, segment_alloc = 0, segment_release = 0, oom = 0;
    std::uint64_t alloc_bytes = 0, freed_bytes = 0, time_ns = 0;
  };
  std::vector<Slice> rows(slices);
  // Slice k covers [floor(k * window / slices), floor((k + 1) * window / slices)),
  // the range its row names: event j is in the last slice that starts at or
  // before it, ceil((j + 1) * slices / window) - 1.
  auto slice_of = [&](std::size_t i) {
    if (window == 0) return std::size_t{0};
    const std::size_t j = i - a.window.begin;
    return std::min(slices - 1, ((j + 1) * slices + window - 1) / window - 1);
  };
  for_each_listed(source, a, options, [&](std::size_t i, const snapshot::Event& e) {
    Slice& s = rows[slice_of(i)];
    ++s.events;
    s.time_ns = e.time_ns;
    using snapshot::EventKind;
    switch (e.kind) {
      case EventKind::alloc: ++s.alloc, s.alloc_bytes += e.size; break;
      case EventKind::free_completed: ++s.free, s.freed_bytes += e.size; break;
      case EventKind::segment_alloc:
      case EventKind::segment_map: ++s.segment_alloc; break;
      case EventKind::segment_release:
      case EventKind::segment_unmap: ++s.segment_release; break;
      case EventKind::oom: ++s.oom; break;
      default: break;
    }
    return true;
  });
  for (std::size_t k = 0; k < slices; ++k) {
    // The slice's range: the first and last index it covers.
    const std::size_t first = a.window.begin + (window * k) / slices;
    const std::size_t next = a.window.begin + (window * (k + 1)) / slices;
    if (next <= first) continue;
    const Slice& s = rows[k];
    table.rows.push_back({static_cast<std::uint64_t>(first), static_cast<std::uint64_t>(next - 1),
                          s.events != 0 ? Value{detail::since_origin(a, s.time_ns)} : Value{}, s.events, s.alloc,
                          s.free, s.segment_alloc, s.segment_release, s.oom, s.alloc_bytes, s.freed_bytes});
  }
}

}  // namespace

Document events_report(EventSource& source, const ReportOptions& options) {
  const Snapshot& snapshot = source.head();
  auto names = std::make_shared<SiteNamer>(snapshot, options.sites);
  AnalysisOptions analysis = detail::analysis_options(options);
  analysis.window_from_ring = false;  // the annotations before the ring are events to list
  const Analysis a = analyze(source, analysis);
  Document doc;
  doc.report = "events";
  doc.title = detail::title(snapshot, a.device, "events");
  if (options.buckets != 0) {
    add_event_buckets(doc, source, a, options);
    detail::add_common_notes(doc, snapshot, a);
    return doc;
  }
  std::vector<Column> columns = {{"event", "event", Unit::event},
                                 {"time_ns", "time", Unit::time},
                                 {"kind", "kind"},
                                 {"address", "address", Unit::address},
                                 {"size", "size", Unit::bytes},
                                 {"aux", "aux", Unit::count},
                                 {"stream", "stream", Unit::address},
                                 {"thread", "thread", Unit::count},
                                 {"site", "site", Unit::none, "-"}};  // an event without a stack
  // Lists the events into `row`; the --limit note into `notes`.
  auto list = [&source, &snapshot, names, a, options](const RowSink& row, std::vector<std::string>& notes) {
    std::size_t shown = 0;
    for_each_listed(source, a, options, [&](std::size_t i, const snapshot::Event& e) {
      if (options.limit != 0 && shown == options.limit) {
        notes.push_back("listing stops at " + std::to_string(options.limit) + " events (--limit)");
        return false;
      }
      ++shown;
      Value aux = e.aux;
      if (is_annotation(e) && e.aux < snapshot.strings.size()) aux = snapshot.strings[e.aux];
      if (e.kind == snapshot::EventKind::category && e.aux < events::kAllocationCategoryCount)
        aux = std::string(events::to_string(static_cast<events::AllocationCategory>(e.aux)));
      row({static_cast<std::uint64_t>(i), detail::since_origin(a, e.time_ns), std::string(snapshot::to_string(e.kind)),
           e.address, e.size, aux, e.stream, static_cast<std::uint64_t>(e.thread),
           e.stack ? Value{names->site(e.stack)} : Value{}});
      return true;
    });
  };
  doc.notes.push_back(
      "size and aux by kind: alloc, free_requested, free_completed: the block's size, the bytes requested; split: "
      "the part handed out, the remainder; merge: the merged size, the bytes absorbed; segment_alloc: the segment's "
      "size, its flags (1 large pool, 2 expandable); oom: the bytes requested, the allocator's cap (0: none), and "
      "address is the device's free bytes; annotation_begin and annotation_end: aux is the name.");
  if (options.stream_rows) {
    doc.streamed = StreamedTable{"events", "events", std::move(columns), list};
  } else {
    Table& table = doc.table("events", "events", std::move(columns));
    list([&table](std::vector<Value>&& row) { table.rows.push_back(std::move(row)); }, doc.notes);
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
