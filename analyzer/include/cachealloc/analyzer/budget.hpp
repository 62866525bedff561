// Memory budgets for CI: "this run's peak reserved stays under 20 GiB".
//
// check_budgets() reads a recording once (analyze(), analysis.hpp) and
// compares the recorded run's figures with each budget given:
//   peak_reserved    the peak of reserved bytes (torch.cuda.max_memory_reserved)
//   peak_allocated   the peak of allocated bytes (torch.cuda.max_memory_allocated)
//   fragmentation    external fragmentation at the reserved peak,
//                    1 - largest free block / cached free bytes (0..1)
//   leaked           bytes still allocated at the end of the trace
//   peak_<category>  a category's largest bytes over the trace
//                    (categories.hpp: inferred, a guess; its line says so)
// Each exceeded budget gives one line naming the figure, its value, the
// budget and the excess.
//
// A trace that does not cover the whole run (ring overflow, history switched
// on mid-run, block sizes inferred) gives lower bounds for the peaks. Where
// the file carries the allocator's own peaks (our recorder's snapshots store
// memory_stats() at the dump, "reserved_bytes.all.peak" and
// "allocated_bytes.all.peak"), the peak checked is the larger of the trace's
// and the recorded one, which is exact: the run's peak since its last
// reset_peak_memory_stats(). That also holds for a trace that began from an
// empty allocator after a higher peak. Otherwise a budget the lower bound meets cannot
// be confirmed: it gives one line in `unconfirmed`, not a pass. The
// fragmentation at the reserved peak is unconfirmed when that peak lies
// before the trace. The bytes leaked at the end are always exact.
//
// Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cachealloc/analyzer/categories.hpp"
#include "cachealloc/analyzer/document.hpp"
#include "cachealloc/analyzer/event_source.hpp"

namespace cachealloc::analyzer {

struct Budgets {
  std::optional<std::uint64_t> peak_reserved;
  std::optional<std::uint64_t> peak_allocated;
  std::optional<double> fragmentation;  // 0..1
  std::optional<std::uint64_t> leaked;
  std::vector<std::pair<Category, std::uint64_t>> categories;  // in the order given
  std::int32_t device = -1;
};

struct BudgetFigures {
  std::uint64_t peak_reserved = 0;
  std::uint64_t peak_allocated = 0;
  double fragmentation = 0;
  std::uint64_t leaked = 0;
  CategoryBytes category_peaks;  // only where a category budget was given
  std::string category_source;   // "inferred", "exact" or "inferred and exact" (docs/GLOSSARY.md)
  // What that source means, for a note: "inferred: from frames, ...".
  std::string category_source_note;
  bool lower_bounds = false;  // the trace does not cover the whole run
  // The peaks are the allocator's recorded ones (exact): the trace began
  // after them, or does not cover the whole run.
  bool peaks_from_stats = false;
  // With peaks_from_stats: the recorded peaks are above the trace's, reached
  // before it began or in events it lost (else the trace reaches them).
  bool recorded_peaks_above_trace = false;
  // A stream that dropped events while it was written (when_full=drop): the
  // replay misses them anywhere in the run, so its figures may be too high as
  // well as too low; the peaks and the leak are the allocator's own.
  bool events_dropped = false;
};

// One budget given, as JSON and CSV report it (check --format json|csv).
struct BudgetVerdict {
  std::string budget;  // the JSON key: peak_reserved, peak_allocated, fragmentation, leaked, peak_<category>
  bool ratio = false;  // fragmentation (0..1); else bytes
  double limit = 0;    // the budget
  std::optional<double> figure;  // the recording's; nullopt: unknown (fragmentation before the trace)
  bool lower_bound = false;      // the figure may be larger (the trace does not cover the whole run)
  bool exceeded = false;
  bool unconfirmed = false;      // met only by a lower bound, or the figure is unknown
};

struct BudgetResult {
  BudgetFigures figures;
  std::vector<BudgetVerdict> budgets;  // one per budget given, in the order above
  std::vector<std::string> exceeded;  // one line per budget exceeded, in the order above
  // One line per budget met only by a lower bound, in the same order.
  std::vector<std::string> unconfirmed;
  bool ok() const noexcept { return exceeded.empty(); }
  bool confirmed() const noexcept { return exceeded.empty() && unconfirmed.empty(); }
};

// Throws SnapshotError for an unreadable file (as analyze()).
BudgetResult check_budgets(EventSource& source, const Budgets& budgets);

// check's exit status: 1 a budget exceeded; 3 none exceeded but one
// unconfirmed (0 with `accept_lower_bounds`); 0 every budget met.
int budget_exit_code(const BudgetResult& result, bool accept_lower_bounds) noexcept;

// The result as a document for --format json and csv: a table "budgets",
// one row per budget (budget, unit, limit, figure, lower_bound, exceeded,
// unconfirmed; an unknown figure is null / empty), and the fields
// exit_code and verdict (met, exceeded, unconfirmed).
Document budget_document(const BudgetResult& result, bool accept_lower_bounds);

// Where the peaks come from, for a note: the allocator's own figures, or
// lower bounds of a trace that does not cover the run; "" when they are the
// trace's exact ones.
std::string peaks_note(const BudgetFigures& figures);

}  // namespace cachealloc::analyzer
