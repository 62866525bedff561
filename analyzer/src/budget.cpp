#include "cachealloc/analyzer/budget.hpp"

#include <cstdio>

#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/document.hpp"

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
  result.figures.peak_reserved = a.peak_reserved.bytes;
  result.figures.peak_allocated = a.peak_allocated.bytes;
  result.figures.fragmentation = a.cache_at_peak_reserved.external_fragmentation();
  result.figures.leaked = a.totals_at_end.allocated;
  result.figures.lower_bounds = a.truncated();
  over_bytes(result.exceeded, "peak reserved", result.figures.peak_reserved, budgets.peak_reserved);
  over_bytes(result.exceeded, "peak allocated", result.figures.peak_allocated, budgets.peak_allocated);
  if (budgets.fragmentation && result.figures.fragmentation > *budgets.fragmentation)
    result.exceeded.push_back("fragmentation at the reserved peak " + percent(result.figures.fragmentation) +
                              " exceeds the budget of " + percent(*budgets.fragmentation));
  over_bytes(result.exceeded, "leaked (allocated at the end)", result.figures.leaked, budgets.leaked);
  return result;
}

}  // namespace cachealloc::analyzer
