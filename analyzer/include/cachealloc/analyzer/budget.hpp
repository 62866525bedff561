// Memory budgets for CI: "this run's peak reserved stays under 20 GiB".
//
// check_budgets() reads a recording once (analyze(), analysis.hpp) and
// compares the recorded run's figures with each budget given:
//   peak_reserved    the peak of reserved bytes (torch.cuda.max_memory_reserved)
//   peak_allocated   the peak of allocated bytes (torch.cuda.max_memory_allocated)
//   fragmentation    external fragmentation at the reserved peak,
//                    1 - largest free block / cached free bytes (0..1)
//   leaked           bytes still allocated at the end of the trace
// Each exceeded budget gives one line naming the figure, its value, the
// budget and the excess. A trace that lost events (ring overflow) gives
// lower bounds for the peaks: a line that passes is then marked so.
//
// Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cachealloc/analyzer/event_source.hpp"

namespace cachealloc::analyzer {

struct Budgets {
  std::optional<std::uint64_t> peak_reserved;
  std::optional<std::uint64_t> peak_allocated;
  std::optional<double> fragmentation;  // 0..1
  std::optional<std::uint64_t> leaked;
  std::int32_t device = -1;
};

struct BudgetFigures {
  std::uint64_t peak_reserved = 0;
  std::uint64_t peak_allocated = 0;
  double fragmentation = 0;
  std::uint64_t leaked = 0;
  bool lower_bounds = false;  // the trace does not cover the whole run
};

struct BudgetResult {
  BudgetFigures figures;
  std::vector<std::string> exceeded;  // one line per budget exceeded, in the order above
  bool ok() const noexcept { return exceeded.empty(); }
};

// Throws SnapshotError for an unreadable file (as analyze()).
BudgetResult check_budgets(EventSource& source, const Budgets& budgets);

}  // namespace cachealloc::analyzer
