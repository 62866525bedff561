// check: each budget, met and exceeded, against the recording's own
// figures; the exit codes of `cachealloc-analyze check` (0 met, 1 exceeded,
// 2 bad input, 3 met only by a lower bound); the doctest helper; and the
// Python helper, which needs no torch. A trace that does not cover the whole
// run is held to the run's true peak: PyTorch's own figure for its ring
// overflow, the allocator's for ours.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "allocator_support.hpp"
#include "cachealloc/allocator.hpp"
#include "cachealloc/analyzer/allocator_replay.hpp"
#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/doctest_budget.hpp"
#include "cachealloc/history.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/pickle.hpp"
#include "cachealloc/snapshot/stream.hpp"

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
  // The budgets hold over the whole trace: a window is refused, never ignored.
  for (const char* window : {" --to 5", " --from 5"}) {
    Run windowed = run(kTool + " check" + file + " --max-peak-reserved 1GiB" + window);
    CHECK(windowed.status == 2);
    CHECK(windowed.out.find("check: the budgets hold over the whole trace") != std::string::npos);
  }
}

TEST_CASE("given --max-category, when a category's peak is met, exceeded, a lower bound or malformed, then it exits 0, "
          "1, 3 or 2") {
  const std::string file = " " + (kSource / "testdata" / "pytorch" / "gru_python_stacks.pickle").string();
  // The GRU's activations peak at 85.94 MiB (90112512 bytes), inferred.
  Run met = run(kTool + " check" + file + " --max-category activation=90112512 --max-category optimizer-state=1GiB");
  CHECK(met.status == 0);
  CHECK(met.out.find("categories' peaks are inferred") != std::string::npos);
  Run over = run(kTool + " check" + file + " --max-category activation=90112511");
  CHECK(over.status == 1);
  CHECK(over.out.find("peak activation (inferred) 85.94 MiB (90112512 bytes) exceeds the budget") == 0);
  Run json = run(kTool + " check" + file + " --max-category activation=8GiB --format json");
  CHECK(json.status == 0);
  CHECK(json.out.find("\"budget\":\"peak_activation\"") != std::string::npos);
  CHECK(json.out.find("are inferred") != std::string::npos);
  const std::string overflowed = " " + (kSource / "testdata" / "pytorch" / "ring_overflow.pickle").string();
  Run bound = run(kTool + " check" + overflowed + " --max-category activation=1GiB");
  CHECK(bound.status == 3);
  CHECK(bound.out.find("is a lower bound") != std::string::npos);
  for (const char* bad : {"activations=1GiB", "activation=lots", "activation", "=1GiB"}) {
    CAPTURE(bad);
    Run r = run(kTool + " check" + file + " --max-category " + bad);
    CHECK(r.status == 2);
    CHECK(r.out.rfind("cachealloc-analyze: error: --max-category: ", 0) == 0);
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  }
}

TEST_CASE("given a trace with category events, --max-category names each category's own source") {
  const std::filesystem::path tagged = std::filesystem::path(CACHEALLOC_BINARY_DIR) / "test_check_budget_tagged.bin";
  REQUIRE(run(std::string(CACHEALLOC_BINARY_DIR) + "/bin/cachealloc-synthetic --events 20000 --seed 3 --threads 1 "
              "--stacks none --exact-categories -f -o " + tagged.string()).status == 0);
  // The loop's 8 parameters of (i + 1) MiB + 1000 i + 4 bytes, each in a block of its own: more than 36 MiB.
  Run r = run(kTool + " check " + tagged.string() + " --max-category parameter=36MiB --max-category temporary=1");
  CHECK(r.status == 1);
  CHECK(r.out.find("peak parameter (exact) ") == 0);
  CHECK(r.out.find("peak temporary (inferred) ") != std::string::npos);
  CHECK(r.out.find("categories' peaks are inferred and exact: as the program recorded them") != std::string::npos);
  std::filesystem::remove(tagged);
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

namespace {
// PyTorch's run whose 2,000-entry ring overflowed; its stats.json holds
// torch.cuda.memory_stats() at the dump: reserved_bytes.all.peak 874,512,384.
const std::filesystem::path kOverflow = kSource / "testdata" / "pytorch" / "ring_overflow.pickle";
constexpr std::uint64_t kOverflowTruePeak = 874512384;
}  // namespace

TEST_CASE("given a PyTorch ring that overflowed, a budget is passed only when the run's peak is known to meet it") {
  // Given the trace's own peak, a lower bound: here it reached PyTorch's figure.
  analyzer::FileEvents source(kOverflow);
  const analyzer::BudgetFigures f = analyzer::check_budgets(source, {}).figures;
  REQUIRE(f.lower_bounds);
  REQUIRE_FALSE(f.peaks_from_stats);
  REQUIRE(f.peak_reserved <= kOverflowTruePeak);
  const std::string file = " " + kOverflow.string();
  // A budget below the bound is a definite excess.
  CHECK(run(kTool + " check" + file + " --max-peak-reserved " + std::to_string(f.peak_reserved - 1)).status == 1);
  // A budget the bound meets cannot be confirmed: exit 3, naming the figure as a bound.
  const std::string above = std::to_string(kOverflowTruePeak);
  Run unconfirmed = run(kTool + " check" + file + " --max-peak-reserved " + above);
  CHECK(unconfirmed.status == 3);
  CHECK(unconfirmed.out.rfind("peak reserved >= ", 0) == 0);
  CHECK(unconfirmed.out.find("cannot be confirmed") != std::string::npos);
  CHECK(unconfirmed.out.find("all budgets met") == std::string::npos);
  // Nor can the fragmentation at a peak the trace may not hold.
  CHECK(run(kTool + " check" + file + " --max-fragmentation 100%").status == 3);
  // The user may accept bounds.
  Run accepted = run(kTool + " check" + file + " --max-peak-reserved " + above + " --accept-lower-bounds");
  CHECK(accepted.status == 0);
  CHECK(accepted.out.find("all budgets met: peak reserved >= ") != std::string::npos);
  // The bytes left allocated at the end come from the stored layout: exact.
  CHECK(run(kTool + " check" + file + " --max-leaked 1TiB").status == 0);
  // The Python helper raises BudgetUnconfirmed, an AssertionError, or exits 3.
  if (std::system("python3 -c pass >/dev/null 2>&1") != 0) return;
  const std::string helper = "CACHEALLOC_ANALYZE=" + kTool + " python3 " + (kSource / "examples" / "ci" / "cachealloc_check.py").string();
  CHECK(run(helper + file + " max_peak_reserved=" + above).status == 3);
  CHECK(run(helper + file + " max_peak_reserved=" + above + " accept_lower_bounds=1").status == 0);
  CHECK(run(helper + file + " max_peak_reserved").status == 2);
  const std::string code = "import sys; sys.path.insert(0, '" + (kSource / "examples" / "ci").string() +
                           "'); import cachealloc_check as c; c.assert_within_budget('" + kOverflow.string() +
                           "', max_peak_reserved='" + above + "')";
  Run raised = run("CACHEALLOC_ANALYZE=" + kTool + " python3 -c \"" + code + "\"");
  CHECK(raised.status == 1);
  CHECK(raised.out.find("BudgetUnconfirmed") != std::string::npos);
}

TEST_CASE("given a PyTorch ring that lost its allocated peak, a budget the run broke is not passed") {
  // Given the run's allocated peak from PyTorch (stats.json:
  // allocated_bytes.all.peak), which lies before the ring's 300 entries:
  // the trace's own peak is lower.
  constexpr std::uint64_t kTrueAllocatedPeak = 510594048;
  analyzer::FileEvents source(kOverflow);
  const analyzer::BudgetFigures f = analyzer::check_budgets(source, {}).figures;
  REQUIRE(f.peak_allocated < kTrueAllocatedPeak);
  // When the budget lies between the trace's peak and the run's, then check
  // does not pass it (before, it printed "all budgets met" and exited 0).
  const std::string between = std::to_string((f.peak_allocated + kTrueAllocatedPeak) / 2);
  Run r = run(kTool + " check " + kOverflow.string() + " --max-peak-allocated " + between);
  CHECK(r.status == 3);
  CHECK(r.out.rfind("peak allocated >= ", 0) == 0);
  CHECK(r.out.find("all budgets met") == std::string::npos);
}

TEST_CASE("given our recorder switched on mid-run, check holds the budget to the allocator's recorded peak") {
  // Given 64 MiB allocated and freed before the history starts, then 4 MiB
  // allocated under it.
  auto device = test_support::simulated();
  CachingAllocator allocator(device);
  allocator.deallocate(allocator.allocate(64 * test_support::MiB, Stream{}));
  allocator.empty_cache();
  const std::uint64_t true_peak = allocator.stats().reserved_bytes[stat_all].peak;
  REQUIRE(true_peak >= 64 * test_support::MiB);
  const auto path = std::filesystem::temp_directory_path() / "cachealloc_check_mid_run.bin";
  {
    HistoryOptions options;
    options.stacks = StackCapture::none;
    HistoryRecorder recorder(allocator, options);
    void* small = allocator.allocate(4 * test_support::MiB, Stream{});
    REQUIRE(recorder.dump_snapshot(path));
    allocator.deallocate(small);
  }
  // When it is checked against 32 MiB, then the run's 64 MiB peak exceeds it
  // although the trace never held more than 20 MiB.
  analyzer::Budgets budgets;
  budgets.peak_reserved = 32 * test_support::MiB;
  const analyzer::BudgetResult r = analyzer::testing::budgets_of(path, budgets);
  CHECK(r.figures.peaks_from_stats);
  CHECK(r.figures.peak_reserved == true_peak);
  CHECK(r.exceeded.size() == 1);
  Run over = run(kTool + " check " + path.string() + " --max-peak-reserved 32MiB");
  CHECK(over.status == 1);
  CHECK(over.out.find("the peaks are the allocator's recorded ones") != std::string::npos);
  // And a budget above the true peak is met outright.
  CHECK(run(kTool + " check " + path.string() + " --max-peak-reserved " + std::to_string(true_peak)).status == 0);
  std::filesystem::remove(path);
}

TEST_CASE("given a stream that dropped events while it was written, check holds budgets to the allocator's own figures") {
  // Given a stream whose writer dropped a free and a segment release
  // (when_full=drop): replayed, the first segment is never released, so the
  // trace holds 4 MiB where the allocator never reserved more than 2 MiB
  using snapshot::Event;
  using snapshot::EventKind;
  const std::uint64_t two = 2 * test_support::MiB;
  const std::uint64_t a = 0x7f0000000000, b = 0x7f1000000000;
  const auto path = std::filesystem::temp_directory_path() / "cachealloc_check_dropped.bin";
  {
    snapshot::Snapshot start;
    start.devices.push_back(snapshot::DeviceInfo{});
    snapshot::StreamFileWriter writer(path, start);
    const std::uint64_t pool = snapshot::segment_flag_large_pool;
    writer.append_events(std::vector<Event>{
        Event{EventKind::segment_alloc, 0, 0, {}, 10, 0, a, two, pool},
        Event{EventKind::alloc, 0, 0, {}, 11, 0, a, two, two},
        // dropped: the free of a and the release of its segment
        Event{EventKind::segment_alloc, 0, 0, {}, 20, 0, b, two, pool},
        Event{EventKind::alloc, 0, 0, {}, 21, 0, b, two, two},
        Event{EventKind::free_requested, 0, 0, {}, 22, 0, b, two, two},
        Event{EventKind::free_completed, 0, 0, {}, 22, 0, b, two, two},
    });
    snapshot::Snapshot end;
    end.dropped_events = 3;
    end.segments.push_back(snapshot::Segment{0, 0, b, two, true, false, {},
                                             {snapshot::Block{b, two, 0, snapshot::BlockState::inactive, {}}}});
    end.stats = {{"reserved_bytes.all.peak", static_cast<std::int64_t>(two)},
                 {"allocated_bytes.all.peak", static_cast<std::int64_t>(two)},
                 {"allocated_bytes.all.current", 0}};
    writer.finish(end);
  }
  // When it is checked against 3 MiB of reserved and no leak
  analyzer::Budgets budgets;
  budgets.peak_reserved = 3 * test_support::MiB;
  budgets.leaked = 0;
  const analyzer::BudgetResult r = analyzer::testing::budgets_of(path, budgets);
  // Then the allocator's 2 MiB meets it, and says so, where the replay's 4 MiB would not
  CHECK(r.figures.events_dropped);
  CHECK(r.figures.peak_reserved == two);
  CHECK(r.figures.leaked == 0);
  CHECK(r.exceeded.empty());
  CHECK(r.confirmed());
  Run met = run(kTool + " check " + path.string() + " --max-peak-reserved 3MiB --max-leaked 0");
  CHECK(met.status == 0);
  CHECK(met.out.find("events were dropped while the stream was written") != std::string::npos);
  // And summary says the figures are approximate, not lower bounds
  Run summary = run(kTool + " summary " + path.string());
  CHECK(summary.status == 0);
  CHECK(summary.out.find("3 events were dropped while the stream was written") != std::string::npos);
  CHECK(summary.out.find("enlarge the ring") == std::string::npos);
  // marked "~", never ">=", in the table, and listed as approximate in JSON and CSV
  CHECK(summary.out.find(">= ") == std::string::npos);
  CHECK(summary.out.find("~ ") != std::string::npos);
  CHECK(summary.out.find("peaks (approximate: events were dropped") != std::string::npos);
  Run json = run(kTool + " summary " + path.string() + " --format json");
  CHECK(json.status == 0);
  CHECK(json.out.find("\"lower_bounds\":[]") != std::string::npos);
  CHECK(json.out.find("\"approximate\":[\"peak_allocated\"") != std::string::npos);
  Run csv = run(kTool + " summary " + path.string() + " --format csv");
  CHECK(csv.out.find("peak_allocated,4194304,approximate") != std::string::npos);
  CHECK(csv.out.find(",true") == std::string::npos);
  // And diff and ranks say the same of it: approximate, not lower bounds
  Run diff = run(kTool + " diff " + path.string() + " " + path.string());
  CHECK(diff.status == 0);
  CHECK(diff.out.find("peaks and totals (B - A), approximate (see the notes)") != std::string::npos);
  CHECK(diff.out.find("both streams dropped events while they were written") != std::string::npos);
  CHECK(diff.out.find("lower bounds") == std::string::npos);
  Run ranks = run(kTool + " ranks " + path.string() + " --format json");
  CHECK(ranks.status == 0);
  CHECK(ranks.out.find("\"lower_bounds\":false,\"approximate\":true") != std::string::npos);
  CHECK(ranks.out.find("\"approximate\":[\"median_peak_reserved\"") != std::string::npos);
  Run ranks_table = run(kTool + " ranks " + path.string());
  CHECK(ranks_table.out.find("their peaks are approximate") != std::string::npos);
  CHECK(ranks_table.out.find("are lower bounds") == std::string::npos);
  std::filesystem::remove(path);
}
