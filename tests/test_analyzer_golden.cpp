// Golden-file tests: the output of every subcommand in every format, for
// small snapshots kept in testdata, compared byte for byte.
//
// Layout: <dir>/<name>.bin is a snapshot; <dir>/<name>/<subcommand>.<format>
// is its expected output. <dir> is analyzer/testdata (snapshots built by
// TraceBuilder below) and the top-level testdata/ (snapshots from our
// generator, cachealloc-synthetic): drop a .bin there, run this test with
// CACHEALLOC_UPDATE_GOLDEN=1 to write its expected outputs, review and commit.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../analyzer/testing/trace_builder.hpp"
#include "cachealloc/analyzer/load.hpp"
#include "cachealloc/analyzer/reports.hpp"
#include "cachealloc/snapshot/format.hpp"

using namespace cachealloc;
using analyzer::testing::TraceBuilder;
namespace fs = std::filesystem;

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
constexpr std::uint64_t kBase = 0x7f0000000000ull;

bool updating() {
  const char* flag = std::getenv("CACHEALLOC_UPDATE_GOLDEN");
  return flag != nullptr && std::string(flag) == "1";
}

const fs::path kOwnDir = fs::path(CACHEALLOC_SOURCE_DIR) / "analyzer" / "testdata";
const fs::path kGeneratedDir = fs::path(CACHEALLOC_SOURCE_DIR) / "testdata";

// A training step in miniature: two segments, a forward phase, a pending
// free, an idle segment released, an OOM and allocations left live.
snapshot::Snapshot small_step() {
  TraceBuilder b;
  const auto weights = b.stack({"cachealloc::CachingAllocator::malloc", "load_weights", "main"});
  const auto activations = b.stack({"cachealloc::CachingAllocator::malloc", "forward", "train_step", "main"});
  const auto grads = b.stack({"backward", "train_step", "main"});
  b.segment(kBase, 20 * kMiB).alloc(kBase, 8 * kMiB, 8 * kMiB - 100, weights);
  b.begin("forward");
  b.alloc(kBase + 8 * kMiB, 4 * kMiB, 3 * kMiB, activations).alloc(kBase + 12 * kMiB, 6 * kMiB, 6 * kMiB, activations);
  b.segment(kBase + 32 * kMiB, 2 * kMiB, false).alloc(kBase + 32 * kMiB, 512, 100, activations);
  b.end("forward").begin("backward");
  b.alloc(kBase + 32 * kMiB + 512, 1024, 1000, grads).free_requested(kBase + 8 * kMiB);
  b.oom(16 * kMiB, 4 * kMiB, 0);
  b.free_completed(kBase + 8 * kMiB).free(kBase + 32 * kMiB).free(kBase + 32 * kMiB + 512).release(kBase + 32 * kMiB);
  b.end("backward");
  b.segment(kBase + 64 * kMiB, 20 * kMiB).alloc(kBase + 64 * kMiB, 12 * kMiB, 12 * kMiB, grads);
  b.free(kBase + 12 * kMiB);
  return b.build();
}

// The same run, recorded with a ring too small for it.
snapshot::Snapshot small_overflow() {
  snapshot::Snapshot snap = small_step();
  snap.events.erase(snap.events.begin(), snap.events.begin() + 6);
  snap.dropped_events = 6;
  return snap;
}

snapshot::Snapshot small_random() { return analyzer::testing::random_trace(9, 300, 3, 3); }

const std::pair<const char*, snapshot::Snapshot (*)()> kBuiltIn[] = {
    {"small_step", small_step}, {"small_overflow", small_overflow}, {"small_random", small_random}};

using Builder = analyzer::Document (*)(const snapshot::Snapshot&, const analyzer::ReportOptions&);
analyzer::Document timeline_in_buckets(const snapshot::Snapshot& snap, const analyzer::ReportOptions& options) {
  analyzer::ReportOptions bucketed = options;
  bucketed.buckets = 8;
  return analyzer::timeline_report(snap, bucketed);
}
const std::pair<const char*, Builder> kSubcommands[] = {
    {"summary", analyzer::summary_report}, {"segments", analyzer::segments_report},
    {"fragmentation", analyzer::fragmentation_report}, {"timeline", analyzer::timeline_report},
    {"timeline-buckets", timeline_in_buckets}, {"peak", analyzer::peak_report},
    {"top", analyzer::top_report},         {"leaks", analyzer::leaks_report},
    {"oom", analyzer::oom_report},         {"events", analyzer::events_report}};
const std::pair<const char*, analyzer::Format> kFormats[] = {
    {"table", analyzer::Format::table}, {"csv", analyzer::Format::csv}, {"json", analyzer::Format::json}};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Compares every subcommand and format of `snapshot` with <dir>/<name>/.
void check_golden(const snapshot::Snapshot& snapshot, const fs::path& expected_dir) {
  for (const auto& [subcommand, build] : kSubcommands) {
    const analyzer::Document document = build(snapshot, {});
    for (const auto& [extension, format] : kFormats) {
      std::ostringstream out;
      analyzer::render(document, format, out);
      const fs::path path = expected_dir / (std::string(subcommand) + "." + extension);
      CAPTURE(path.string());
      if (updating()) {
        fs::create_directories(expected_dir);
        std::ofstream(path, std::ios::binary) << out.str();
        continue;
      }
      REQUIRE_MESSAGE(fs::exists(path), "missing golden file; run with CACHEALLOC_UPDATE_GOLDEN=1 and review");
      CHECK(out.str() == read_file(path));
    }
  }
}

}  // namespace

TEST_CASE("the golden snapshots in analyzer/testdata are the ones the builder makes") {
  for (const auto& [name, make] : kBuiltIn) {
    CAPTURE(name);
    // given a snapshot built in code
    const snapshot::Snapshot built = make();
    const fs::path path = kOwnDir / (std::string(name) + ".bin");
    // Only a missing one is written: the stored files are older format
    // versions that test_reader and the compatibility rule rely on.
    if (updating() && !fs::exists(path)) {
      fs::create_directories(kOwnDir);
      snapshot::write_snapshot(built, path);
    }
    // when its stored copy is loaded
    const snapshot::Snapshot stored = analyzer::load(path);
    // then both hold the same events and layout
    CHECK(stored.events == built.events);
    CHECK(stored.segments == built.segments);
    CHECK(stored.dropped_events == built.dropped_events);
  }
}

TEST_CASE("every subcommand in every format matches its golden file") {
  for (const fs::path& dir : {kOwnDir, kGeneratedDir}) {
    if (!fs::is_directory(dir)) continue;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.path().extension() != ".bin") continue;
      const fs::path expected = dir / entry.path().stem();
      // A generated snapshot without expected outputs is not ours to judge yet.
      if (!updating() && !fs::is_directory(expected)) continue;
      CAPTURE(entry.path().string());
      check_golden(analyzer::load(entry.path()), expected);
    }
  }
}
