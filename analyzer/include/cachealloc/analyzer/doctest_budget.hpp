// A doctest helper for CI jobs written in C++: fails the test case with one
// message per budget a recording exceeds.
//
//   #include <doctest/doctest.h>
//   #include "cachealloc/analyzer/doctest_budget.hpp"
//   TEST_CASE("training step stays within 20 GiB") {
//     cachealloc::analyzer::Budgets budgets;
//     budgets.peak_reserved = 20ull << 30;
//     CACHEALLOC_CHECK_BUDGETS("run.bin", budgets);
//   }
//
// Include doctest first. Links cachealloc::analyzer.
#pragma once

#include <filesystem>

#include "cachealloc/analyzer/budget.hpp"
#include "cachealloc/analyzer/event_source.hpp"

namespace cachealloc::analyzer::testing {

inline BudgetResult budgets_of(const std::filesystem::path& recording, const Budgets& budgets) {
  FileEvents source(recording);
  return check_budgets(source, budgets);
}

}  // namespace cachealloc::analyzer::testing

// CHECKs that `recording` (a path) meets `budgets`; each exceeded budget, and
// each met only by a lower bound (a trace that does not cover the whole run
// and carries no recorded peaks), is reported as its own failure, naming the
// figure, its value and the budget.
#define CACHEALLOC_CHECK_BUDGETS(recording, budgets)                                                    \
  do {                                                                                                  \
    const auto cachealloc_budget_result = ::cachealloc::analyzer::testing::budgets_of(recording, budgets); \
    for (const auto& cachealloc_budget_line : cachealloc_budget_result.exceeded)                        \
      FAIL_CHECK(cachealloc_budget_line);                                                               \
    for (const auto& cachealloc_budget_line : cachealloc_budget_result.unconfirmed)                     \
      FAIL_CHECK(cachealloc_budget_line);                                                               \
    CHECK(cachealloc_budget_result.confirmed());                                                        \
  } while (false)
