#include "cachealloc/analyzer/budget.hpp"

#include <algorithm>
#include <array>
#include <cstdio>

#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/document.hpp"
#include "reports/category_sections.hpp"
#include "reports/report_helpers.hpp"

namespace cachealloc::analyzer {
namespace {

std::string percent(double ratio) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f%%", ratio * 100.0);
  return text;
}

void over_bytes(std::vector<std::string>& out, const char* name, std::uint64_t value,
                const std::optional<std::uint64_t>& budget) {
  if (!budget || value <= *budget) return;
  out.push_back(std::string(name) + " " + format_bytes(value) + " (" + std::to_string(value) + " bytes) exceeds the budget of " +
                format_bytes(*budget) + " by " + format_bytes(value - *budget));
}

}  // namespace

BudgetResult check_budgets(EventSource& source, const Budgets& budgets) {
  AnalysisOptions options;
  options.device = budgets.device;
  const Analysis a = analyze(source, options);
  BudgetResult result;
  BudgetFigures& f = result.figures;
  f.peak_reserved = a.peak_reserved.bytes;
  f.peak_allocated = a.peak_allocated.bytes;
  f.fragmentation = a.cache_at_peak_reserved.external_fragmentation();
  f.leaked = a.totals_at_end.allocated;
  f.lower_bounds = a.truncated();
  // The recorded peaks, where the file has them and they are this device's.
  bool fragmentation_known = !f.lower_bounds;
  const snapshot::Snapshot& head = source.head();
  const auto stat = [&](const char* key) -> std::optional<std::uint64_t> {
    const auto it = head.stats.find(key);
    if (it == head.stats.end() || it->second < 0 || head.devices.size() > 1) return std::nullopt;
    return static_cast<std::uint64_t>(it->second);
  };
  const auto recorded_reserved = stat("reserved_bytes.all.peak");
  const auto recorded_allocated = stat("allocated_bytes.all.peak");
  // A run's peak can also lie before a trace that began from an empty
  // allocator (history switched on after empty_cache()): the recorded peak
  // is then the higher one.
  const auto recorded_leaked = stat("allocated_bytes.all.current");
  f.events_dropped = detail::dropped_mid_stream(head) && recorded_reserved && recorded_allocated && recorded_leaked;
  if (f.events_dropped) {
    // The replay's peaks may be too high (a dropped free) as well as too
    // low: the allocator's own are the run's.
    f.peaks_from_stats = true;
    fragmentation_known = false;
    f.peak_reserved = *recorded_reserved;
    f.peak_allocated = *recorded_allocated;
    f.leaked = *recorded_leaked;
  } else if (recorded_reserved && recorded_allocated) {
    f.recorded_peaks_above_trace = *recorded_reserved > f.peak_reserved || *recorded_allocated > f.peak_allocated;
    f.peaks_from_stats = f.recorded_peaks_above_trace || f.lower_bounds;
    // The trace's peak reached the run's: the fragmentation there is the one at the peak.
    fragmentation_known = *recorded_reserved <= f.peak_reserved;
    f.peak_reserved = std::max(f.peak_reserved, *recorded_reserved);
    f.peak_allocated = std::max(f.peak_allocated, *recorded_allocated);
  }
  const bool peaks_exact = !f.lower_bounds || f.peaks_from_stats;
  const auto bytes_verdict = [&](const char* key, std::uint64_t value, const std::optional<std::uint64_t>& budget,
                                 bool exact) {
    BudgetVerdict& v = result.budgets.emplace_back();
    v.budget = key;
    v.limit = static_cast<double>(*budget);
    v.figure = static_cast<double>(value);
    v.lower_bound = !exact;
    v.exceeded = value > *budget;
    v.unconfirmed = !v.exceeded && !exact;
  };
  const auto bound = [&](const char* name, std::uint64_t value, const std::optional<std::uint64_t>& budget) {
    if (!budget || value > *budget || peaks_exact) return;
    result.unconfirmed.push_back(std::string(name) + " >= " + format_bytes(value) +
                                 " is a lower bound (the trace does not cover the whole run): the budget of " +
                                 format_bytes(*budget) + " cannot be confirmed");
  };
  over_bytes(result.exceeded, "peak reserved", f.peak_reserved, budgets.peak_reserved);
  bound("peak reserved", f.peak_reserved, budgets.peak_reserved);
  if (budgets.peak_reserved) bytes_verdict("peak_reserved", f.peak_reserved, budgets.peak_reserved, peaks_exact);
  over_bytes(result.exceeded, "peak allocated", f.peak_allocated, budgets.peak_allocated);
  bound("peak allocated", f.peak_allocated, budgets.peak_allocated);
  if (budgets.peak_allocated) bytes_verdict("peak_allocated", f.peak_allocated, budgets.peak_allocated, peaks_exact);
  if (budgets.fragmentation) {
    BudgetVerdict& v = result.budgets.emplace_back();
    v.budget = "fragmentation";
    v.ratio = true;
    v.limit = *budgets.fragmentation;
    if (fragmentation_known) v.figure = f.fragmentation;
    v.exceeded = fragmentation_known && f.fragmentation > *budgets.fragmentation;
    v.unconfirmed = !fragmentation_known;
  }
  if (budgets.fragmentation && !fragmentation_known) {
    // The figure is the trace's own peak's, which may not be the run's.
    result.unconfirmed.push_back("fragmentation at the reserved peak is unknown (the peak may lie before the trace; " +
                                 percent(f.fragmentation) + " at the trace's own peak): the budget of " +
                                 percent(*budgets.fragmentation) + " cannot be confirmed");
  } else if (budgets.fragmentation && f.fragmentation > *budgets.fragmentation) {
    result.exceeded.push_back("fragmentation at the reserved peak " + percent(f.fragmentation) +
                              " exceeds the budget of " + percent(*budgets.fragmentation));
  }
  over_bytes(result.exceeded, "leaked (allocated at the end)", f.leaked, budgets.leaked);
  if (budgets.leaked) bytes_verdict("leaked", f.leaked, budgets.leaked, true);  // the end is always exact
  std::array<std::string, kCategoryCount> category_sources;  // each category's own
  if (!budgets.categories.empty()) {
    const Categorization categories = categorize(source, a.device, detail::from_start_of(a));
    f.category_peaks = categories.peaks();
    f.category_source = detail::category_source(categories);
    f.category_source_note = detail::category_peaks_note(f.category_source);
    for (std::size_t c = 0; c < kCategoryCount; ++c)
      category_sources[c] = detail::category_source(categories, static_cast<Category>(c));
  }
  // A category's peak inside a trace that does not cover the run is a lower
  // bound, as the trace's own peaks are; the recorded peaks say nothing of it.
  for (const auto& [category, limit] : budgets.categories) {
    const std::uint64_t value = f.category_peaks[category];
    const std::string key = std::string("peak_") + category_key(category);
    const std::string name =
        "peak " + std::string(category_label(category)) + " (" + category_sources[static_cast<std::size_t>(category)] + ")";
    over_bytes(result.exceeded, name.c_str(), value, limit);
    if (value <= limit && f.lower_bounds)
      result.unconfirmed.push_back(name + " >= " + format_bytes(value) +
                                   " is a lower bound (the trace does not cover the whole run): the budget of " +
                                   format_bytes(limit) + " cannot be confirmed");
    bytes_verdict(key.c_str(), value, limit, !f.lower_bounds);
  }
  return result;
}

int budget_exit_code(const BudgetResult& result, bool accept_lower_bounds) noexcept {
  if (!result.ok()) return 1;
  return result.confirmed() || accept_lower_bounds ? 0 : 3;
}

Document budget_document(const BudgetResult& result, bool accept_lower_bounds) {
  Document doc;
  doc.report = "check";
  doc.title = "check: memory budgets";
  const int code = budget_exit_code(result, accept_lower_bounds);
  doc.group("", "verdict")
      .add("verdict", "verdict", std::string(code == 1 ? "exceeded" : code == 3 ? "unconfirmed" : "met"))
      .add("exit_code", "exit code", static_cast<std::uint64_t>(code), Unit::count);
  // Bytes are whole numbers in JSON and CSV; the fragmentation a share (0..1).
  const auto number = [](const BudgetVerdict& v, double x) -> Value {
    return v.ratio ? Value{x} : Value{static_cast<std::uint64_t>(x)};
  };
  Table& table = doc.table("budgets", "budgets",
                           {{"budget", "budget"},
                            {"unit", "unit"},
                            {"limit", "limit"},
                            {"figure", "figure"},
                            {"lower_bound", "lower bound"},
                            {"exceeded", "exceeded"},
                            {"unconfirmed", "unconfirmed"}});
  for (const BudgetVerdict& v : result.budgets) {
    table.rows.push_back({v.budget, std::string(v.ratio ? "ratio" : "bytes"), number(v, v.limit),
                          v.figure ? number(v, *v.figure) : Value{}, v.lower_bound, v.exceeded, v.unconfirmed});
  }
  doc.csv_table = "budgets";
  for (const std::string& line : result.exceeded) doc.notes.push_back(line);
  for (const std::string& line : result.unconfirmed) doc.notes.push_back(line);
  if (!result.figures.category_source.empty())
    doc.notes.push_back("the categories' peaks (peak_<category>) are " + result.figures.category_source_note);
  if (std::string note = peaks_note(result.figures); !note.empty()) doc.notes.push_back(std::move(note));
  return doc;
}

std::string peaks_note(const BudgetFigures& figures) {
  if (figures.events_dropped)
    return "events were dropped while the stream was written: the peaks and the leak are the allocator's recorded "
           "ones, not the replay's";
  if (figures.peaks_from_stats && figures.recorded_peaks_above_trace)
    return "the peaks are the allocator's recorded ones, above the trace's: reached before the trace began or in "
           "events it lost";
  if (figures.peaks_from_stats)
    return "the peaks are the allocator's recorded ones, which the trace reaches: exact although the trace does not "
           "cover the whole run";
  if (figures.lower_bounds) return "the trace does not cover the whole run; its peaks are lower bounds";
  return "";
}

}  // namespace cachealloc::analyzer
