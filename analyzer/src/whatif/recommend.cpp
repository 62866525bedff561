// The sweep's report, the recommendation drawn from it, and the oom report's
// recommendation section.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string_view>
#include <utility>

#include "cachealloc/analyzer/reports.hpp"
#include "cachealloc/analyzer/sweep.hpp"

namespace cachealloc::analyzer {
namespace {

// 1204511 -> "1,204,511".
std::string grouped(std::uint64_t value) {
  std::string digits = std::to_string(value), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string where(const OomPoint& oom) {
  if (oom.at_start) return "before the trace: its start holds more than the cap";
  std::string text = "at event " + grouped(oom.event);
  if (!oom.annotation.empty()) text += " (" + oom.annotation + ")";
  return text;
}

std::string oom_text(const RunFigures& figures) { return figures.first_oom ? where(*figures.first_oom) : "no"; }

std::string label(const SweepPoint& point) { return point.changes.empty() ? std::string("(recorded)") : point.changes; }

Value optional_event(const RunFigures& figures) {
  if (!figures.first_oom || figures.first_oom->at_start) return std::monostate{};
  return figures.first_oom->event;
}

// The settings' short names in a table's "changes" column, so a row fits
// about 120 columns; a note under the table spells them out.
constexpr std::pair<std::string_view, std::string_view> kShortSetting[] = {
    {"expandable_segments", "exp"},
    {"max_split_size_mb", "split"},
    {"roundup_power2_divisions", "round"},
    {"garbage_collection_threshold", "gc"}};

std::string short_changes(std::string changes) {
  for (const auto& [name, short_name] : kShortSetting) {
    for (std::size_t at = changes.find(name); at != std::string::npos; at = changes.find(name, at + short_name.size()))
      changes.replace(at, name.size(), short_name);
  }
  std::replace(changes.begin(), changes.end(), ',', ' ');
  return changes;
}

void add_ranking(Document& doc, const std::string& key, const std::string& title, const SweepResult& r,
                 std::size_t limit) {
  // A table shows the figures that rank; each setting's own column, the
  // settings replayed in full and the OOM's annotation are in JSON and CSV.
  std::vector<Column> columns{{"rank", "#", Unit::count}, {"changes", "changes"}};
  for (const SweepAxis& axis : r.axes) columns.push_back({axis.key, axis.key, Unit::none, "unknown", true});
  for (Column c : std::vector<Column>{{"peak_reserved", "reserved", Unit::bytes},
                                      {"peak_allocated", "allocated", Unit::bytes},
                                      {"fragmentation_at_peak", "frag.", Unit::ratio},
                                      {"device_allocs", "dev allocs", Unit::count},
                                      {"alloc_retries", "retries", Unit::count},
                                      {"fits", "fits"},
                                      {"headroom", "headroom", Unit::bytes, "no cap"},  // cap - peak reserved
                                      {"largest_scale", "scale", Unit::none},
                                      {"oom_event", "OOM at", Unit::count, "none"},  // no OOM
                                      {"oom_annotation", "OOM annotation", Unit::none, "-", true},
                                      {"config", "settings replayed", Unit::none, "unknown", true}})
    columns.push_back(std::move(c));
  // The scale is measured only with a cap to fit under; else the column is empty.
  const bool scaled = !r.ranked.empty() && r.ranked.front().largest_scale;
  if (!scaled) columns[columns.size() - 4].json_only = true;
  Table& table = doc.table(key, title, std::move(columns));
  for (std::size_t i = 0; i < r.ranked.size() && i < limit; ++i) {
    const SweepPoint& p = r.ranked[i];
    std::vector<Value> row{static_cast<std::uint64_t>(i + 1), short_changes(label(p))};
    for (const auto& setting : p.settings) row.emplace_back(setting.second);
    row.emplace_back(p.figures.peak_reserved);
    row.emplace_back(p.figures.peak_allocated);
    row.emplace_back(p.figures.fragmentation_at_peak);
    row.emplace_back(p.figures.device_allocs);
    row.emplace_back(p.figures.retries ? Value(*p.figures.retries) : Value(std::monostate{}));
    row.emplace_back(p.fits);
    row.emplace_back(p.headroom ? Value(*p.headroom) : Value(std::monostate{}));
    row.emplace_back(p.largest_scale ? Value(*p.largest_scale) : Value(std::monostate{}));
    // "start": the trace's start already held more than the cap.
    row.emplace_back(p.figures.first_oom && p.figures.first_oom->at_start ? Value(std::string("start"))
                                                                          : optional_event(p.figures));
    row.emplace_back(p.figures.first_oom && !p.figures.first_oom->annotation.empty()
                         ? Value(p.figures.first_oom->annotation)
                         : Value(std::monostate{}));
    row.emplace_back(p.config.empty() ? std::string("(defaults)") : p.config);
    table.rows.push_back(std::move(row));
  }
  doc.notes.push_back(key + ": changes from the recorded settings, exp = expandable_segments, split = "
                      "max_split_size_mb, round = roundup_power2_divisions, gc = garbage_collection_threshold; "
                      "reserved, allocated and frag. (external fragmentation) at the replayed peak; dev allocs: "
                      "segments reserved from the device. --format json or csv adds one column per setting and "
                      "the settings replayed in full.");
}

void add_baseline(Document& doc, const SweepResult& r) {
  FieldGroup& base = doc.group("baseline", "The recorded settings");
  base.add("recorded_peak_reserved", "recorded peak reserved", r.baseline.recorded.peak_reserved, Unit::bytes);
  base.add("recorded_oom", "recorded run out of memory", oom_text(r.baseline.recorded));
  base.add("recorded_oom_event", "recorded OOM event", optional_event(r.baseline.recorded), Unit::count).json_only_if(true);
  base.add("replayed_peak_reserved", "replayed peak reserved (at the cap)", r.baseline.replayed.peak_reserved, Unit::bytes);
  base.add("replayed_oom", "replayed run out of memory (at the cap)", oom_text(r.baseline.replayed));
  base.add("replayed_oom_event", "replayed OOM event", optional_event(r.baseline.replayed), Unit::count).json_only_if(true);
}

// The recorded run ran out of memory, the recorded settings replayed at the
// sweep's cap did not: the recorded cap is not in the file.
std::string unreproduced_oom(const SweepResult& r) {
  return "the recorded run ran out of memory " + where(*r.baseline.recorded.first_oom) +
         " but the recorded settings do not at " + format_bytes(r.cap) +
         ": its cap is not in the file (a PyTorch pickle does not store it); give it with --capacity or --fraction";
}

// Points over the cap that never ran out of memory: PyTorch's cap check
// under expandable segments, which the allocator mirrors.
void note_over_cap(Document& doc, const SweepResult& r) {
  const auto over = std::count_if(r.ranked.begin(), r.ranked.end(), [](const SweepPoint& p) {
    return !p.figures.first_oom && p.headroom && *p.headroom < 0;
  });
  if (over == 0) return;
  doc.notes.push_back(std::to_string(over) + " of the settings passed the cap without running out of memory, as "
                      "PyTorch does: under expandable segments it checks the cap against the request's segment "
                      "size, not against what the segment maps; they do not count as fitting (headroom < 0)");
}

std::string cap_text(const SweepResult& r) { return format_bytes(r.cap) + " (" + grouped(r.cap) + " B)"; }

}  // namespace

Document sweep_report(const SweepResult& r) {
  Document doc;
  doc.report = "sweep";
  doc.title = "Replay under a grid of allocator settings on the simulated device";
  FieldGroup& run = doc.group("", "Sweep");
  run.add("events", "events", r.events, Unit::count);
  run.add("recorded_config", "recorded settings", r.recorded_config.empty() ? std::string("(defaults)") : r.recorded_config);
  run.add("cap", "cap", r.cap ? Value(r.cap) : Value(std::monostate{}), Unit::bytes).absent_as("none");
  run.add("device_total", "device total (recorded)", r.baseline.device_total_known ? Value(r.device_total) : Value(),
          Unit::bytes);
  run.add("simulated_device_total", "simulated device total", r.device_total, Unit::bytes);
  run.add("points", "settings tried", static_cast<std::uint64_t>(r.ranked.size()), Unit::count);
  const bool scaled = !r.ranked.empty() && r.ranked.front().largest_scale;
  run.add("ranked_by", "ranked by",
          std::string(scaled ? "the largest request scale that fits under the cap, then as without it"
                      : r.cap ? "fits under the cap, then peak reserved (most headroom first); OOMs: latest first"
                            : "peak reserved, lowest first"));
  add_baseline(doc, r);
  add_ranking(doc, "sweep", "Ranking", r, r.ranked.size());
  doc.csv_table = "sweep";
  doc.notes.insert(doc.notes.begin(), r.baseline.notes.begin(), r.baseline.notes.end());
  note_over_cap(doc, r);
  return doc;
}

// Why no setting can fit, when the recorded OOM alone shows it: the live
// bytes at the OOM plus its request exceed the cap whatever the settings.
std::string why_nothing_fits(const SweepResult& r) {
  if (!r.oom_bounds || r.cap == 0) return {};
  const OomCapBounds& b = *r.oom_bounds;
  if (b.allocated + b.requested <= r.cap) return {};
  return "; no setting can: at the recorded OOM (event " + grouped(b.event) + ") " + format_bytes(b.allocated) +
         " was live and " + format_bytes(b.requested) + " was requested, " + format_bytes(b.allocated + b.requested) +
         " in all, above the " + format_bytes(r.cap) + " cap";
}

// Every verdict compares with one baseline: the recorded settings replayed
// at the same cap as every candidate (the recording's own peak is beside it
// in the report, not in the comparison).
Recommendation recommend(const SweepResult& r) {
  Recommendation out;
  const RunFigures& base = r.baseline.replayed;
  const std::string tried = std::to_string(r.ranked.size()) + " settings tried";
  const auto top = std::find_if(r.ranked.begin(), r.ranked.end(), [](const SweepPoint& p) { return p.changed != 0; });
  if (top != r.ranked.end()) out.best = *top;
  const auto recorded = std::find_if(r.ranked.begin(), r.ranked.end(), [](const SweepPoint& p) { return p.changed == 0; });
  const bool base_fits = recorded != r.ranked.end() ? recorded->fits : !base.first_oom;
  if (!base_fits) {
    const std::string base_failure =
        base.first_oom && base.first_oom->at_start
            ? "run out of memory before the trace: its start already reserves " +
                  format_bytes(base.first_oom->requested) + ", which no setting changes"
        : base.first_oom ? "run out of memory " + where(*base.first_oom) + ", a " +
                             format_bytes(base.first_oom->requested) + " request"
                       : "pass the cap (peak reserved " + format_bytes(base.peak_reserved) + ")";
    if (out.best && out.best->fits) {
      out.helps = true;
      out.verdict = "with " + out.best->changes + " the run fits in " + cap_text(r) + ", peak reserved " +
                    format_bytes(out.best->figures.peak_reserved) + "; the recorded settings " + base_failure;
      return out;
    }
    out.verdict = "nothing helps: no setting of the " + tried + " fits in " + cap_text(r) +
                  "; the recorded settings " + base_failure;
    if (out.best && out.best->figures.first_oom && base.first_oom &&
        out.best->figures.first_oom->event > base.first_oom->event)
      out.verdict += ", the furthest (" + out.best->changes + ") " + where(*out.best->figures.first_oom);
    const std::string why = why_nothing_fits(r);
    if (!why.empty()) {
      out.verdict += why;
    } else if (const std::uint64_t live = std::max(base.peak_allocated, r.baseline.recorded.peak_allocated);
               live > r.cap) {
      out.verdict += "; the live allocations alone peak at " + format_bytes(live) + ", above the capacity";
    }
    return out;
  }
  const bool top_is_recorded = !r.ranked.empty() && r.ranked.front().changed == 0;
  if (out.best && !top_is_recorded && out.best->fits && out.best->figures.peak_reserved < base.peak_reserved) {
    out.helps = true;
    const double saved = 1.0 - static_cast<double>(out.best->figures.peak_reserved) / static_cast<double>(base.peak_reserved);
    char percent[32];
    std::snprintf(percent, sizeof percent, "%.1f%%", saved * 100);
    out.verdict = "with " + out.best->changes + " peak reserved falls from " + format_bytes(base.peak_reserved) +
                  " to " + format_bytes(out.best->figures.peak_reserved) + " (-" + percent + ")";
    if (r.cap)
      out.verdict += "; at " + cap_text(r) + " capacity the headroom grows from " +
                     format_bytes(r.cap - base.peak_reserved) + " to " +
                     format_bytes(r.cap - out.best->figures.peak_reserved);
    return out;
  }
  out.verdict = "nothing helps: the recorded settings' peak reserved (" + format_bytes(base.peak_reserved) +
                ", replayed" + (r.cap ? " at " + cap_text(r) : std::string()) + ") is already the lowest of the " + tried;
  return out;
}

// Where the cap came from, in words.
std::string cap_source_text(const SweepResult& r) {
  switch (r.cap_source) {
    case CapSource::none: return "none: no cap";
    case CapSource::asked: return r.oom_bounds || r.cap == r.device_total ? "the device total" : "--capacity or --fraction";
    case CapSource::recorded: return "the recorded cap (from its OOM)";
    case CapSource::oom_bound:
      return "the recorded OOM at event " + grouped(r.oom_bounds->event) + ": the run stopped at a cap the file does "
             "not hold, between " + format_bytes(r.oom_bounds->lowest) + " (the peak reserved up to it) and " +
             format_bytes(r.oom_bounds->highest) + " (reserved then + the request); its lowest is taken, so a setting "
             "that fits here fits whatever the cap was; give another with --capacity";
    case CapSource::device_at_oom:
      return "the recorded OOM at event " + grouped(r.oom_bounds->event) + ": the device was full; reserved then "
             "plus the device's free bytes";
  }
  return {};
}

Document recommend_report(EventSource& source, const RecommendOptions& options) {
  const SweepResult r = sweep(source, options.sweep);
  const Recommendation rec = recommend(r);
  Document doc;
  doc.report = "recommend";
  doc.title = "Recommended allocator setting (replayed on the simulated device)";
  Text& verdict = doc.text("verdict", "Verdict");
  verdict.lines.push_back(rec.verdict);
  verdict.table_only = true;
  FieldGroup& top = doc.group("", "Recommendation");
  top.add("verdict", "verdict", rec.verdict).json_only_if(true);
  top.add("helps", "a setting helps", rec.helps);
  top.add("setting", "setting", rec.helps ? Value(rec.best->changes) : Value(std::monostate{})).absent_as("none");
  top.add("cap", "capacity", r.cap ? Value(r.cap) : Value(std::monostate{}), Unit::bytes).absent_as("none");
  top.add("cap_source", "capacity from",
          options.sweep.capacity ? std::string("--capacity")
          : options.sweep.fraction ? std::string("--fraction")
                                   : cap_source_text(r));
  top.add("points", "settings tried", static_cast<std::uint64_t>(r.ranked.size()), Unit::count);
  add_baseline(doc, r);
  if (rec.best) {
    FieldGroup& best = doc.group("best", "The best other setting");
    best.add("changes", "changes", rec.best->changes);
    best.add("config", "settings replayed", rec.best->config);
    best.add("peak_reserved", "peak reserved", rec.best->figures.peak_reserved, Unit::bytes);
    best.add("peak_allocated", "peak allocated", rec.best->figures.peak_allocated, Unit::bytes);
    best.add("oom", "runs out of memory", oom_text(rec.best->figures));
    best.add("oom_event", "OOM event", optional_event(rec.best->figures), Unit::count).json_only_if(true);
  }
  add_ranking(doc, "ranking", "The top of the ranking (replay --sweep shows all)", r, 5);
  doc.csv_table = "ranking";
  doc.notes.insert(doc.notes.begin(), r.baseline.notes.begin(), r.baseline.notes.end());
  note_over_cap(doc, r);
  if (r.baseline.recorded.first_oom && !r.baseline.replayed.first_oom)
    doc.notes.push_back(unreproduced_oom(r));
  return doc;
}

Document oom_report_with_recommendation(EventSource& source, const ReportOptions& options, unsigned threads,
                                        std::uint64_t max_events) {
  Document doc = oom_report(source, options);
  const auto ooms = std::find_if(doc.sections.begin(), doc.sections.end(), [](const Section& s) {
    return std::holds_alternative<Table>(s) && std::get<Table>(s).key == "ooms";
  });
  if (ooms == doc.sections.end() || std::get<Table>(*ooms).rows.empty()) return doc;
  FieldGroup& section = doc.group("recommendation", "Recommendation (replay under other settings: recommend FILE)");
  if (source.event_count() > max_events) {
    section.add("verdict", "verdict",
                "not computed: " + grouped(source.event_count()) + " events is more than the oom report replays (" +
                    grouped(max_events) + "); run cachealloc-analyze recommend FILE");
    return doc;
  }
  try {
    SweepOptions sweep_options;
    sweep_options.device = options.device;
    sweep_options.threads = threads;
    // A small grid, 16 replays: the sweep's axes, two values of each.
    for (SweepAxis axis : default_sweep_axes(source, options.device, true)) {
      if (axis.key == "max_split_size_mb" && axis.values.size() > 2)
        axis.values = {axis.values.front(), axis.values[(axis.values.size()) / 2]};
      if (axis.values.size() > 2) axis.values.resize(2);
      sweep_options.axes.push_back(std::move(axis));
    }
    const SweepResult r = sweep(source, sweep_options);
    const Recommendation rec = recommend(r);
    section.add("verdict", "verdict", rec.verdict);
    section.add("setting", "setting", rec.helps ? Value(rec.best->changes) : Value(std::monostate{})).absent_as("none");
    section.add("cap", "capacity used", r.cap ? Value(r.cap) : Value(std::monostate{}), Unit::bytes).absent_as("none");
    section.add("cap_source", "capacity from", cap_source_text(r));
    section.add("points", "settings tried", static_cast<std::uint64_t>(r.ranked.size()), Unit::count);
    if (r.baseline.recorded.first_oom && !r.baseline.replayed.first_oom)
      section.add("caveat", "caveat", unreproduced_oom(r));
  } catch (const std::exception& error) {
    section.add("verdict", "verdict", "not computed: the replay cannot run this trace: " + std::string(error.what()));
  }
  return doc;
}

}  // namespace cachealloc::analyzer
