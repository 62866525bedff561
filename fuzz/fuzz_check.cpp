// libFuzzer target: the budget check (check) on whatever load() accepts,
// against budgets no run can exceed, budgets of 0, and budgets from the
// input's last byte. Asserted: every line check prints is one printable
// line; budgets of 2^64-1 bytes and 100% are never exceeded; a budget of 0
// bytes is exceeded exactly when the figure is above 0 (peaks and leaks are
// exact or lower bounds, so a lower bound above 0 exceeds it too); the
// fragmentation is a share from 0 to 1. A refusal must be a SnapshotError of
// one line.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "cachealloc/analyzer/budget.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace cachealloc;

analyzer::BudgetResult check(const snapshot::Snapshot& snapshot, const analyzer::Budgets& budgets) {
  analyzer::SnapshotEvents source(snapshot);
  analyzer::BudgetResult result = analyzer::check_budgets(source, budgets);
  for (const std::string& line : result.exceeded) fuzz::check_line(line);
  for (const std::string& line : result.unconfirmed) fuzz::check_line(line);
  const double fragmentation = result.figures.fragmentation;
  if (!(fragmentation >= 0 && fragmentation <= 1)) std::abort();
  return result;
}

void check_all(const snapshot::Snapshot& snapshot, unsigned bits) {
  constexpr std::uint64_t kAll = std::numeric_limits<std::uint64_t>::max();
  analyzer::Budgets all;
  all.peak_reserved = kAll;
  all.peak_allocated = kAll;
  all.fragmentation = 1.0;
  all.leaked = kAll;
  const analyzer::BudgetResult loose = check(snapshot, all);
  if (!loose.exceeded.empty()) std::abort();

  analyzer::Budgets none;
  none.peak_reserved = 0;
  none.peak_allocated = 0;
  none.leaked = 0;
  const analyzer::BudgetResult zero = check(snapshot, none);
  const analyzer::BudgetFigures& f = zero.figures;
  const std::size_t over = (f.peak_reserved > 0) + (f.peak_allocated > 0) + (f.leaked > 0);
  if (zero.exceeded.size() != over) std::abort();
  if (f.peak_reserved != loose.figures.peak_reserved || f.leaked != loose.figures.leaked) std::abort();

  // Budgets around the figures: bit i of the last byte halves budget i.
  analyzer::Budgets near;
  near.peak_reserved = (bits & 1u) ? f.peak_reserved / 2 : f.peak_reserved;
  near.peak_allocated = (bits & 2u) ? f.peak_allocated / 2 : f.peak_allocated;
  near.fragmentation = (bits & 4u) ? f.fragmentation / 2 : f.fragmentation;
  near.leaked = (bits & 8u) ? f.leaked / 2 : f.leaked;
  check(snapshot, near);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::optional<snapshot::Snapshot> snapshot = fuzz::load_small(fuzz::as_bytes(data, size));
  if (!snapshot) return 0;
  try {
    check_all(*snapshot, fuzz::option_bits(data, size));
  } catch (const snapshot::SnapshotError& error) {
    fuzz::check_message(error.what());
  }
  return 0;
}
