// The state before the first event of a trace that never overflowed is the
// empty allocator, whatever window a report asks for: a report that stops at
// the peak (segments --at, the html report, a --to window) sees exactly
// PyTorch's reserved peak. Ground truth: PyTorch's memory_stats() beside each
// real pickle of testdata/pytorch (NAME.stats.json).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/load.hpp"
#include "cachealloc/analyzer/replay.hpp"
#include "../analyzer/testing/parsers.hpp"

using namespace cachealloc;

namespace {
const std::filesystem::path kPytorch = std::filesystem::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "pytorch";

std::uint64_t pytorch_figure(const std::filesystem::path& stats, const std::string& key) {
  std::ifstream in(stats);
  std::stringstream text;
  text << in.rdbuf();
  return static_cast<std::uint64_t>(analyzer::testing::parse_json(text.str())[key].number());
}
}  // namespace

TEST_CASE("a window ending at the reserved peak sees PyTorch's reserved peak, expandable segments included") {
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kPytorch)) {
    const std::filesystem::path pickle = entry.path();
    if (pickle.extension() != ".pickle") continue;
    const std::filesystem::path stats = kPytorch / (pickle.stem().string() + ".stats.json");
    if (!std::filesystem::exists(stats)) continue;
    CAPTURE(pickle.filename().string());
    const snapshot::Snapshot snap = analyzer::load(pickle);
    if (snap.dropped_events != 0) continue;  // a ring that overflowed: its start is derived, not known
    const std::uint64_t truth = pytorch_figure(stats, "reserved_bytes.all.peak");
    const analyzer::Analysis whole = analyzer::analyze(snap, {});
    REQUIRE(whole.peak_reserved.bytes == truth);
    // When the window ends just after the peak event, the analysis there...
    analyzer::AnalysisOptions to_peak;
    to_peak.window = {0, whole.peak_reserved.event + 1};
    const analyzer::Analysis windowed = analyzer::analyze(snap, to_peak);
    CHECK(windowed.totals_at_end.reserved == truth);
    CHECK(windowed.peak_reserved.bytes == truth);
    // ...and the layout replayed to that event hold PyTorch's peak.
    std::uint64_t reserved = 0;
    analyzer::replay_to(snap, whole.device, whole.peak_reserved.event, [&](const analyzer::Replay& replay) {
      for (const snapshot::Segment& segment : replay.layout()) {
        for (const snapshot::Block& block : segment.blocks)
          if (block.state != snapshot::BlockState::unmapped) reserved += block.size;
      }
    });
    CHECK(reserved == truth);
    ++checked;
  }
  CHECK(checked >= 4);
}
