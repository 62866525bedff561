// check (issue 16): each budget, met and exceeded, against the recording's own
// figures; the exit codes of `cachealloc-analyze check` (0 met, 1 exceeded,
// 2 bad input); the doctest helper; and the Python helper, which needs no torch.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "cachealloc/analyzer/allocator_replay.hpp"
#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/doctest_budget.hpp"

using namespace cachealloc;

namespace {

const std::filesystem::path kSource = CACHEALLOC_SOURCE_DIR;
const std::filesystem::path kFile = kSource / "testdata" / "pytorch" / "corpus" / "varlen_transformer.pickle";
const std::string kTool = std::string(CACHEALLOC_BINARY_DIR) + "/bin/cachealloc-analyze";

struct Run {
  int status = -1;
  std::string out;
};

Run run(const std::string& command) {
  Run r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe)) r.out += buffer;
  const int status = pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

analyzer::BudgetFigures figures() {
  analyzer::FileEvents source(kFile);
  return analyzer::check_budgets(source, {}).figures;
}

}  // namespace

TEST_CASE("given budgets at the recorded figures, when checked, then all are met; one byte less, then each fails alone") {
  const analyzer::BudgetFigures f = figures();
  // The recorded peaks, from PyTorch's own stats of this run (corpus stats.json, the dump).
  REQUIRE(f.peak_reserved > 0);
  analyzer::Budgets at;
  at.peak_reserved = f.peak_reserved;
  at.peak_allocated = f.peak_allocated;
  at.fragmentation = f.fragmentation;
  at.leaked = f.leaked;
  analyzer::FileEvents source(kFile);
  CHECK(analyzer::check_budgets(source, at).ok());
  for (int which = 0; which < 4; ++which) {
    analyzer::Budgets b = at;
    if (which == 0) b.peak_reserved = f.peak_reserved - 1;
    if (which == 1) b.peak_allocated = f.peak_allocated - 1;
    if (which == 2) b.fragmentation = f.fragmentation * 0.5;
    if (which == 3) b.leaked = f.leaked == 0 ? 0 : f.leaked - 1;
    analyzer::FileEvents s(kFile);
    const analyzer::BudgetResult r = analyzer::check_budgets(s, b);
    if (which == 3 && f.leaked == 0) {
      CHECK(r.ok());
      continue;
    }
    REQUIRE(r.exceeded.size() == 1);
    const char* names[] = {"peak reserved", "peak allocated", "fragmentation", "leaked"};
    CHECK(r.exceeded[0].rfind(names[which], 0) == 0);
  }
}

TEST_CASE("given a recording, when checked with the doctest helper within its budgets, then the test passes") {
  const analyzer::BudgetFigures f = figures();
  analyzer::Budgets budgets;
  budgets.peak_reserved = f.peak_reserved;
  budgets.fragmentation = 1.0;
  CACHEALLOC_CHECK_BUDGETS(kFile, budgets);
}

TEST_CASE("given the command line, when a budget is met, exceeded or malformed, then it exits 0, 1 or 2") {
  const analyzer::BudgetFigures f = figures();
  const std::string file = " " + kFile.string();
  Run met = run(kTool + " check" + file + " --max-peak-reserved " + std::to_string(f.peak_reserved));
  CHECK(met.status == 0);
  CHECK(met.out.find("all budgets met") != std::string::npos);
  Run over = run(kTool + " check" + file + " --max-peak-reserved 1MiB --max-peak-allocated 1KiB --max-fragmentation 0%");
  CHECK(over.status == 1);
  CHECK(over.out.find("peak reserved ") == 0);
  CHECK(over.out.find("\npeak allocated ") != std::string::npos);
  CHECK(over.out.find("\nfragmentation ") != std::string::npos);
  Run frag = run(kTool + " check" + file + " --max-fragmentation 100%");
  CHECK(frag.status == 0);
  Run none = run(kTool + " check" + file);
  CHECK(none.status == 2);
  CHECK(none.out.find("give at least one budget") != std::string::npos);
  Run bad = run(kTool + " check" + file + " --max-peak-reserved lots");
  CHECK(bad.status == 2);
  CHECK(bad.out.find("--max-peak-reserved: 'lots' is not a byte count") != std::string::npos);
  Run bad_share = run(kTool + " check" + file + " --max-fragmentation 130%");
  CHECK(bad_share.status == 2);
  Run missing = run(kTool + " check /nonexistent.bin --max-peak-reserved 1GiB");
  CHECK(missing.status == 2);
}

TEST_CASE("given the Python helper, when a budget is met, exceeded or malformed, then it returns, raises or exits 2") {
  if (std::system("python3 -c pass >/dev/null 2>&1") != 0) return;  // no Python: nothing to check
  const std::string helper = "CACHEALLOC_ANALYZE=" + kTool + " python3 " + (kSource / "examples" / "ci" / "cachealloc_check.py").string();
  const std::string file = " " + kFile.string();
  CHECK(run(helper + file + " max_peak_reserved=1TiB").status == 0);
  Run over = run(helper + file + " max_peak_reserved=1MiB");
  CHECK(over.status == 1);
  CHECK(over.out.find("peak reserved ") == 0);
  CHECK(run(helper + file + " max_peak_reserved=lots").status == 2);
  // The module API: assert_within_budget raises AssertionError naming the budget.
  const std::string code = "import sys; sys.path.insert(0, '" + (kSource / "examples" / "ci").string() +
                           "'); import cachealloc_check as c; c.assert_within_budget('" + kFile.string() +
                           "', max_peak_allocated='1KiB')";
  Run raised = run("CACHEALLOC_ANALYZE=" + kTool + " python3 -c \"" + code + "\"");
  CHECK(raised.status == 1);
  CHECK(raised.out.find("AssertionError") != std::string::npos);
  CHECK(raised.out.find("peak allocated") != std::string::npos);
}

TEST_CASE("check's fragmentation at the reserved peak is the one replay reports, with the largest free block counted") {
  // It once read the cache at the peak without its largest free block, so
  // 1 - 0 / cached_free: 100% whenever anything was cached.
  for (const std::filesystem::path& file :
       {kFile, kSource / "analyzer" / "testdata" / "small_step.bin", kSource / "testdata" / "synthetic_2k_native.bin"}) {
    INFO(file.string());
    analyzer::FileEvents checked(file);
    const double fragmentation = analyzer::check_budgets(checked, {}).figures.fragmentation;
    analyzer::FileEvents replayed(file);
    const analyzer::ReplayResult replay = analyzer::replay_allocator(replayed);
    CHECK(fragmentation == doctest::Approx(replay.recorded.fragmentation_at_peak));
    CHECK(fragmentation < 1.0);
    if (replay.recorded.cached_free_at_peak > replay.recorded.largest_free_at_peak) CHECK(fragmentation > 0.0);
  }
}
