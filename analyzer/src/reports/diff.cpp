// diff A B: each recording reduced to a RunSummary, then compared figure by
// figure, site by site (user frames) and phase by phase (name, occurrence).
#include <algorithm>
#include <cstdio>
#include <map>

#include "cachealloc/analyzer/compare.hpp"
#include "core/replay_hot.hpp"
#include "reports/category_sections.hpp"
#include "reports/report_helpers.hpp"

namespace cachealloc::analyzer {

using snapshot::Event;
using snapshot::EventKind;

namespace {

bool is_request(EventKind kind) {
  return kind == EventKind::alloc || kind == EventKind::oom || kind == EventKind::free_requested ||
         kind == EventKind::empty_cache;
}

// The second replay: every annotation's figures, and the fragmentation at the
// reserved peak. O(1) per event; memory: the replay and the phases.
void phases_pass(EventSource& source, const Analysis& analysis, RunSummary& run) {
  const snapshot::Snapshot& head = source.head();
  InitialLayout start = analysis.starts_mid_run ? confirmed_start(source, analysis.device)
                                                : InitialLayout{analysis.device, {}, 0, 0};
  Replay replay(start.segments, analysis.device, head.stacks.size(), Replay::sizes_may_be_inferred(head, analysis.device));
  start.segments.clear();
  std::vector<std::size_t> open;  // indices into run.phases, outermost first
  std::map<std::string, std::uint32_t> seen;
  // The fragmentation at the reserved peak, read where the replay report
  // reads it (allocator_replay.cpp): the call that reached the peak ends with
  // its request (the reservation comes first), so the figures are read when
  // the next request starts.
  std::uint64_t peak_reserved = replay.totals().reserved;
  bool peak_pending = true;  // the start is the peak until something exceeds it
  bool peak_call_done = false;
  CacheFigures at_peak = replay.cache_figures(true);
  // A closed (or, at the end, still open) phase hands its figures to the one around it.
  auto close = [&](std::size_t k, std::size_t event) {
    PhaseSummary& phase = run.phases[open[k]];
    const Totals& t = replay.totals();
    phase.end_event = event;
    phase.allocated_at_end = t.allocated;
    phase.reserved_at_end = t.reserved;
    if (k > 0) {
      PhaseSummary& outer = run.phases[open[k - 1]];
      outer.peak_allocated = std::max(outer.peak_allocated, phase.peak_allocated);
      outer.peak_reserved = std::max(outer.peak_reserved, phase.peak_reserved);
      outer.allocs += phase.allocs;
      outer.alloc_bytes += phase.alloc_bytes;
    }
    open.erase(open.begin() + static_cast<std::ptrdiff_t>(k));
  };
  const auto name_of = [&](std::uint64_t id) {
    return id < head.strings.size() ? head.strings[id] : std::string("<unnamed>");
  };
  for_each_event(source, 0, source.event_count(), [&](std::size_t i, const Event& e) {
    if (is_request(e.kind) && e.device == analysis.device) {
      if (peak_call_done) {
        at_peak = replay.cache_figures(true);
        peak_pending = peak_call_done = false;
      } else if (peak_pending) {
        peak_call_done = true;
      }
    }
    replay.apply_inline(e);
    const Totals& t = replay.totals();
    if (e.kind == EventKind::annotation_begin) {
      PhaseSummary phase;
      phase.name = name_of(e.aux);
      phase.occurrence = ++seen[phase.name];
      for (const std::size_t k : open) phase.path += (phase.path.empty() ? "" : "/") + run.phases[k].name;
      phase.begin_event = i;
      phase.allocated_at_begin = phase.peak_allocated = t.allocated;
      phase.reserved_at_begin = phase.peak_reserved = t.reserved;
      open.push_back(run.phases.size());
      run.phases.push_back(std::move(phase));
      return true;
    }
    if (e.kind == EventKind::annotation_end) {
      const std::string name = name_of(e.aux);
      for (std::size_t k = open.size(); k-- > 0;) {
        if (run.phases[open[k]].name != name) continue;
        // Phases opened inside it and never closed end with it.
        while (open.size() > k + 1) close(open.size() - 1, i);
        close(k, i);
        break;
      }
      return true;
    }
    if (e.device != analysis.device) return true;
    if (t.reserved > peak_reserved) {
      peak_reserved = t.reserved;
      peak_pending = true;
      peak_call_done = false;
    }
    if (open.empty()) return true;
    PhaseSummary& inner = run.phases[open.back()];
    inner.peak_allocated = std::max(inner.peak_allocated, t.allocated);
    inner.peak_reserved = std::max(inner.peak_reserved, t.reserved);
    if (e.kind == EventKind::alloc) {
      ++inner.allocs;
      inner.alloc_bytes += e.size;
    }
    return true;
  });
  if (peak_pending) at_peak = replay.cache_figures(true);
  while (!open.empty()) {
    const std::size_t k = open.size() - 1;
    close(k, kNoEvent);
  }
  for (PhaseSummary& phase : run.phases)
    phase.before_ring = phase.end_event != kNoEvent && phase.end_event < analysis.ring_begins_at;
  run.fragmentation_at_peak = at_peak.external_fragmentation();
  run.has_phases_pass = true;
}

std::int64_t change(std::uint64_t a, std::uint64_t b) {
  return static_cast<std::int64_t>(b) - static_cast<std::int64_t>(a);
}
Value relative(std::uint64_t a, std::uint64_t b) {
  if (a == 0) return Value{};
  return (static_cast<double>(b) - static_cast<double>(a)) / static_cast<double>(a);
}

const char* metric_name(DiffOptions::SiteMetric by) {
  switch (by) {
    case DiffOptions::SiteMetric::allocated_over_run: return "bytes allocated over the run";
    case DiffOptions::SiteMetric::end: return "bytes live at the end";
    case DiffOptions::SiteMetric::peak: break;
  }
  return "bytes live at the allocated peak";
}

std::uint64_t metric(const SiteSummary& s, DiffOptions::SiteMetric by) {
  switch (by) {
    case DiffOptions::SiteMetric::allocated_over_run: return s.alloc_bytes;
    case DiffOptions::SiteMetric::end: return s.live_at_end;
    case DiffOptions::SiteMetric::peak: break;
  }
  return s.bytes_at_peak;
}

std::string phase_key(const PhaseSummary& p) { return p.name + '\n' + std::to_string(p.occurrence); }

}  // namespace

RunSummary summarize(EventSource& source, const SummaryOptions& options) {
  const snapshot::Snapshot& head = source.head();
  SiteNamer names(head, options.sites);
  AnalysisOptions analysis_options;
  analysis_options.device = options.device;
  const Analysis a = analyze(source, analysis_options);
  RunSummary run;
  run.program = head.header.program;
  run.device = a.device;
  for (const snapshot::DeviceInfo& info : head.devices) {
    if (info.index != a.device) continue;
    run.device_name = info.name;
    const std::uint64_t total = info.driver_total_at_dump != 0 ? info.driver_total_at_dump : info.total_bytes;
    if (total != 0) run.device_total = total;
  }
  run.events = a.event_count;
  run.approximate = detail::dropped_mid_stream(head);
  run.lower_bounds = a.truncated() && !run.approximate;
  run.peak_reserved = a.peak_reserved.bytes;
  run.peak_allocated = a.peak_allocated.bytes;
  run.peak_active = a.peak_active.bytes;
  run.peak_requested = a.peak_requested.bytes;
  run.reserved_at_end = a.totals_at_end.reserved;
  run.allocated_at_end = a.totals_at_end.allocated;
  run.peak_segments = a.peak_segments;
  run.segments_at_end = a.segments_at_end;
  run.device_allocs = a.device_allocs();
  run.device_frees = a.device_frees();
  run.ooms = a.ooms.size();
  for (const OomRecord& oom : a.ooms)
    if (oom.cap != 0) run.cap = std::min(run.cap.value_or(oom.cap), oom.cap);
  run.fragmentation_at_end = a.cache_at_end.external_fragmentation();
  CategorizeOptions at_peak_and_end;
  at_peak_and_end.moments = detail::peak_and_end(a);
  at_peak_and_end.start = a.start;
  at_peak_and_end.max_kept_changes = 0;  // the walk sums these two moments itself
  const Categorization categories = categorize(source, a.device, at_peak_and_end);
  std::vector<CategoryBytes> by_category = categories.at(at_peak_and_end.moments);
  if (at_peak_and_end.moments[0] != detail::state_after(a, a.peak_allocated.event)) std::swap(by_category[0], by_category[1]);
  run.categories_at_peak = by_category[0];
  run.categories_at_end = by_category[1];
  run.category_source = detail::category_source(categories);

  std::map<std::vector<std::string>, SiteSummary> by_frames;
  for (const SiteFigures& s : a.sites) {
    if (s.allocs == 0 && s.bytes_at_peak_allocated == 0 && s.live_bytes_at_end == 0) continue;
    std::vector<std::string> frames = names.lines(s.stack);
    SiteSummary& site = by_frames[frames];
    if (site.frames.empty()) site.frames = std::move(frames);
    site.allocs += s.allocs;
    site.alloc_bytes += s.alloc_bytes;
    site.bytes_at_peak += s.bytes_at_peak_allocated;
    site.live_at_end += s.live_bytes_at_end;
  }
  for (auto& [frames, site] : by_frames) run.sites.push_back(std::move(site));
  std::stable_sort(run.sites.begin(), run.sites.end(), [](const SiteSummary& x, const SiteSummary& y) {
    return x.bytes_at_peak != y.bytes_at_peak ? x.bytes_at_peak > y.bytes_at_peak : x.alloc_bytes > y.alloc_bytes;
  });
  run.site_notes = names.notes();
  if (options.phases) phases_pass(source, a, run);
  return run;
}

Document diff_report(const RunSummary& a, const RunSummary& b, const DiffOptions& options) {
  Document doc;
  doc.report = "diff";
  doc.title = "diff: A " + a.file + " -> B " + b.file;
  doc.csv_table = "sites";
  FieldGroup& files = doc.group("", "the recordings");
  files.add("a_file", "A", a.file)
      .add("b_file", "B", b.file)
      .add("a_program", "A's program", a.program.empty() ? Value{} : Value{a.program})
      .add("b_program", "B's program", b.program.empty() ? Value{} : Value{b.program})
      .add("a_device", "A's device", static_cast<std::int64_t>(a.device))
      .add("b_device", "B's device", static_cast<std::int64_t>(b.device));

  const bool bounds = a.lower_bounds || b.lower_bounds;
  const bool approximate = a.approximate || b.approximate;
  const char* caveat = bounds && approximate ? ", lower bounds or approximate (see the notes)"
                       : bounds              ? ", lower bounds (see the notes)"
                       : approximate         ? ", approximate (see the notes)"
                                             : "";
  Table& peaks = doc.table("peaks", std::string("peaks and totals (B - A)") + caveat,
                           {{"metric", "metric"},
                            {"a", "A", Unit::bytes},
                            {"b", "B", Unit::bytes},
                            {"change", "change", Unit::bytes},
                            {"change_ratio", "change %", Unit::ratio}});
  auto peak_row = [&](const char* name, std::uint64_t x, std::uint64_t y) {
    peaks.rows.push_back({std::string(name), x, y, change(x, y), relative(x, y)});
  };
  peak_row("peak_reserved", a.peak_reserved, b.peak_reserved);
  peak_row("peak_allocated", a.peak_allocated, b.peak_allocated);
  peak_row("peak_active", a.peak_active, b.peak_active);
  peak_row("peak_requested", a.peak_requested, b.peak_requested);
  peak_row("reserved_at_end", a.reserved_at_end, b.reserved_at_end);
  peak_row("allocated_at_end", a.allocated_at_end, b.allocated_at_end);

  const std::string category_source =
      a.category_source == b.category_source ? a.category_source : a.category_source + " and " + b.category_source;
  Table& categories = doc.table("categories", "categories (" + category_source + ") at the allocated peak and at the end (B - A)",
                                {{"category", "category"},
                                 {"a_at_peak_allocated", "A at peak", Unit::bytes},
                                 {"b_at_peak_allocated", "B at peak", Unit::bytes},
                                 {"change_at_peak_allocated", "change", Unit::bytes},
                                 {"a_at_end", "A at end", Unit::bytes},
                                 {"b_at_end", "B at end", Unit::bytes},
                                 {"change_at_end", "change", Unit::bytes},
                                 {"source", "source"}});
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    const auto category = static_cast<Category>(c);
    const std::uint64_t pa = a.categories_at_peak[category], pb = b.categories_at_peak[category];
    const std::uint64_t ea = a.categories_at_end[category], eb = b.categories_at_end[category];
    categories.rows.push_back({std::string(category_key(category)), pa, pb, change(pa, pb), ea, eb, change(ea, eb),
                               category_source});
  }
  doc.notes.push_back(detail::category_note(category_source));

  Table& counts = doc.table("counts", "segments and device calls (B - A)",
                            {{"metric", "metric"},
                             {"a", "A", Unit::count},
                             {"b", "B", Unit::count},
                             {"change", "change", Unit::count}});
  auto count_row = [&](const char* name, std::uint64_t x, std::uint64_t y) {
    counts.rows.push_back({std::string(name), x, y, change(x, y)});
  };
  count_row("peak_segments", a.peak_segments, b.peak_segments);
  count_row("segments_at_end", a.segments_at_end, b.segments_at_end);
  count_row("device_allocs", a.device_allocs, b.device_allocs);
  count_row("device_frees", a.device_frees, b.device_frees);
  count_row("ooms", a.ooms, b.ooms);
  count_row("events", a.events, b.events);

  Table& frag = doc.table("fragmentation", "external fragmentation (change in points)",
                          {{"metric", "metric"},
                           {"a", "A", Unit::ratio},
                           {"b", "B", Unit::ratio},
                           {"change", "change", Unit::ratio}});
  if (a.fragmentation_at_peak && b.fragmentation_at_peak)
    frag.rows.push_back({std::string("at_peak_reserved"), *a.fragmentation_at_peak, *b.fragmentation_at_peak,
                         *b.fragmentation_at_peak - *a.fragmentation_at_peak});
  frag.rows.push_back({std::string("at_end"), a.fragmentation_at_end, b.fragmentation_at_end,
                       b.fragmentation_at_end - a.fragmentation_at_end});

  // Sites: A's and B's merged by frames.
  struct Pair {
    const SiteSummary* a = nullptr;
    const SiteSummary* b = nullptr;
  };
  std::map<std::vector<std::string>, Pair> pairs;
  for (const SiteSummary& s : a.sites) pairs[s.frames].a = &s;
  for (const SiteSummary& s : b.sites) pairs[s.frames].b = &s;
  struct Row {
    const char* change;
    std::int64_t delta;
    const Pair* pair;
  };
  std::vector<Row> rows;
  struct Tally {
    std::uint64_t sites = 0;
    std::int64_t bytes = 0;
  };
  std::map<std::string, Tally> tally;
  const SiteSummary none;
  for (const auto& [frames, pair] : pairs) {
    const std::uint64_t x = pair.a ? metric(*pair.a, options.by) : 0;
    const std::uint64_t y = pair.b ? metric(*pair.b, options.by) : 0;
    const char* what = !pair.a ? "new" : !pair.b ? "gone" : y > x ? "grown" : y < x ? "shrunk" : "unchanged";
    Tally& t = tally[what];
    ++t.sites;
    t.bytes += change(x, y);
    if (std::string_view(what) != "unchanged") rows.push_back({what, change(x, y), &pair});
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& x, const Row& y) {
    const auto mx = x.delta < 0 ? -x.delta : x.delta;
    const auto my = y.delta < 0 ? -y.delta : y.delta;
    return mx > my;
  });
  FieldGroup& summary = doc.group("site_changes", std::string("sites, by ") + metric_name(options.by));
  for (const char* what : {"grown", "shrunk", "new", "gone", "unchanged"}) {
    const Tally& t = tally[what];
    summary.add(std::string(what), std::string(what) + " (sites)", t.sites, Unit::count)
        .add(std::string(what) + "_bytes", std::string(what) + " (bytes, B - A)", t.bytes, Unit::bytes);
  }
  Table& sites = doc.table("sites", std::string("sites that changed, by ") + metric_name(options.by) + ", largest change first",
                           {{"change", "change"},
                            {"bytes_change", "B - A", Unit::bytes},
                            {"a_bytes", "A", Unit::bytes},
                            {"b_bytes", "B", Unit::bytes},
                            {"a_allocations", "A allocs", Unit::count},
                            {"b_allocations", "B allocs", Unit::count},
                            {"a_allocated_over_run", "A allocated over run", Unit::bytes},
                            {"b_allocated_over_run", "B allocated over run", Unit::bytes},
                            {"stack", "site"}});
  for (std::size_t i = 0; i < detail::listed(rows.size(), options.limit); ++i) {
    const Row& r = rows[i];
    const SiteSummary& x = r.pair->a ? *r.pair->a : none;
    const SiteSummary& y = r.pair->b ? *r.pair->b : none;
    sites.rows.push_back({std::string(r.change), r.delta, metric(x, options.by), metric(y, options.by), x.allocs, y.allocs,
                          x.alloc_bytes, y.alloc_bytes, (r.pair->a ? x : y).frames});
  }
  if (options.limit != 0 && rows.size() > options.limit)
    doc.notes.push_back(std::to_string(rows.size() - options.limit) + " more changed sites not shown (--limit)");

  // Phases: A's order, then B's phases that A lacks.
  Table& phases = doc.table("phases", "annotated phases, matched by name and occurrence",
                            {{"phase", "phase"},
                             {"occurrence", "#", Unit::count},
                             {"in", "in"},
                             {"a_peak_allocated", "A peak alloc", Unit::bytes},
                             {"b_peak_allocated", "B peak alloc", Unit::bytes},
                             {"peak_allocated_change", "change", Unit::bytes},
                             {"a_peak_reserved", "A peak reserved", Unit::bytes},
                             {"b_peak_reserved", "B peak reserved", Unit::bytes},
                             {"peak_reserved_change", "change", Unit::bytes},
                             {"a_allocated_at_end", "A alloc at end", Unit::bytes},
                             {"b_allocated_at_end", "B alloc at end", Unit::bytes},
                             {"a_allocations", "A allocs", Unit::count},
                             {"b_allocations", "B allocs", Unit::count}});
  std::map<std::string, const PhaseSummary*> in_b;
  for (const PhaseSummary& p : b.phases) in_b.emplace(phase_key(p), &p);
  std::map<std::string, bool> matched;
  std::size_t only_a = 0, only_b = 0;
  auto phase_row = [&](const PhaseSummary* x, const PhaseSummary* y) {
    const PhaseSummary& p = x ? *x : *y;
    const auto opt = [](const PhaseSummary* s, std::uint64_t PhaseSummary::*field) {
      return s && !s->before_ring ? Value{s->*field} : Value{};
    };
    const auto delta = [&](std::uint64_t PhaseSummary::*field) {
      return x && y && !x->before_ring && !y->before_ring ? Value{change(x->*field, y->*field)} : Value{};
    };
    phases.rows.push_back({p.path.empty() ? p.name : p.path + "/" + p.name, static_cast<std::uint64_t>(p.occurrence),
                           std::string(x && y ? "both" : x ? "A only" : "B only"),
                           opt(x, &PhaseSummary::peak_allocated), opt(y, &PhaseSummary::peak_allocated),
                           delta(&PhaseSummary::peak_allocated), opt(x, &PhaseSummary::peak_reserved),
                           opt(y, &PhaseSummary::peak_reserved), delta(&PhaseSummary::peak_reserved),
                           opt(x, &PhaseSummary::allocated_at_end), opt(y, &PhaseSummary::allocated_at_end),
                           opt(x, &PhaseSummary::allocs), opt(y, &PhaseSummary::allocs)});
  };
  for (const PhaseSummary& p : a.phases) {
    const auto found = in_b.find(phase_key(p));
    if (found != in_b.end()) matched[found->first] = true;
    else ++only_a;
    phase_row(&p, found == in_b.end() ? nullptr : found->second);
  }
  for (const PhaseSummary& p : b.phases) {
    if (matched.contains(phase_key(p))) continue;
    ++only_b;
    phase_row(nullptr, &p);
  }
  if (!a.has_phases_pass || !b.has_phases_pass) {
  } else if (a.phases.empty() && b.phases.empty()) {
    doc.notes.push_back("neither recording has annotations (record_function, annotate_begin): no phases to compare.");
  } else if (only_a + only_b != 0) {
    doc.notes.push_back(std::to_string(only_a) + " phase(s) only in A and " + std::to_string(only_b) +
                        " only in B (phases match by name and occurrence).");
  }
  for (const auto& [run, which] : {std::pair{&a, "A"}, std::pair{&b, "B"}}) {
    const auto unrecorded =
        std::count_if(run->phases.begin(), run->phases.end(), [](const PhaseSummary& p) { return p.before_ring; });
    if (unrecorded != 0)
      doc.notes.push_back(std::to_string(unrecorded) + " of " + which + "'s phases ended before its ring's first " +
                          "memory event (its trace begins mid-run, with older annotations): no memory was recorded in "
                          "them, so their figures are unknown.");
  }
  if (a.lower_bounds || b.lower_bounds) {
    doc.notes.push_back(std::string(a.lower_bounds && b.lower_bounds ? "neither trace covers"
                                    : a.lower_bounds                 ? "A's trace does not cover"
                                                                     : "B's trace does not cover") +
                        " the whole run (ring overflow, a mid-run start or inferred block sizes): peaks, counts and "
                        "site totals there are lower bounds, and so is any change computed from them.");
  }
  if (a.approximate || b.approximate) {
    doc.notes.push_back(std::string(a.approximate && b.approximate ? "both streams dropped events while they were"
                                    : a.approximate                 ? "A's stream dropped events while it was"
                                                                    : "B's stream dropped events while it was") +
                        " written (when_full was drop): the replay misses them anywhere in the run, so peaks, counts "
                        "and site totals there are approximate, neither exact nor bounds, and so is any change "
                        "computed from them.");
  }
  for (const RunSummary* run : {&a, &b})
    for (const std::string& note : run->site_notes)
      if (std::find(doc.notes.begin(), doc.notes.end(), note) == doc.notes.end()) doc.notes.push_back(note);
  if (a.device_total && b.device_total && *a.device_total != *b.device_total)
    doc.notes.push_back("the devices differ in size: A " + format_bytes(*a.device_total) + ", B " +
                        format_bytes(*b.device_total) + ".");
  return doc;
}

}  // namespace cachealloc::analyzer
