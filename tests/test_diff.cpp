// diff A B: two recordings with a known change. Both runs go
// through the real allocator on the simulated device with the recorder on;
// B is A with one site grown, one new site inside a new annotation, and one
// site gone. The expected figures come from the construction and from the
// allocator's own stats (MemoryStats), never from the analyzer's output.
// The PyTorch case compares two real corpus runs with their stats.json.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cachealloc/allocator.hpp"
#include "cachealloc/analyzer/allocator_replay.hpp"
#include "cachealloc/analyzer/compare.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/load.hpp"
#include "cachealloc/history.hpp"
#include "cachealloc/snapshot/pickle.hpp"
#include "../analyzer/testing/parsers.hpp"
#include "allocator_support.hpp"

using namespace cachealloc;
using analyzer::testing::Json;
using test_support::MiB;

namespace {

const std::filesystem::path kCorpus = std::filesystem::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "pytorch" / "corpus";

}  // namespace

// Sites: each a function of its own, kept out of line and out of tail calls,
// so each allocation's first user frame names it.
[[gnu::noinline]] void* diff_weights_site(CachingAllocator& allocator, std::size_t bytes) {
  void* p = allocator.allocate(bytes);
  asm volatile("" ::: "memory");
  return p;
}
[[gnu::noinline]] void* diff_activation_site(CachingAllocator& allocator, std::size_t bytes) {
  void* p = allocator.allocate(bytes);
  asm volatile("" ::: "memory");
  return p;
}
[[gnu::noinline]] void* diff_scratch_site(CachingAllocator& allocator, std::size_t bytes) {
  void* p = allocator.allocate(bytes);
  asm volatile("" ::: "memory");
  return p;
}
[[gnu::noinline]] void* diff_extra_site(CachingAllocator& allocator, std::size_t bytes) {
  void* p = allocator.allocate(bytes);
  asm volatile("" ::: "memory");
  return p;
}

namespace {

struct Run {
  snapshot::Snapshot snapshot;
  MemoryStats stats;  // the allocator's own figures at the end
};

// A: weights 64 MiB; two "step"s, each an activation of 32 MiB, and in step 1
// a 512 KiB scratch buffer freed at once. B: activations of 40 MiB, no
// scratch, and in step 2 an "extra" annotation holding a 16 MiB buffer that
// stays to the end. Every call site is the same line in both runs.
[[gnu::noinline]] Run record(bool b) {
  CachingAllocator allocator(test_support::simulated());
  HistoryOptions options;
  options.stacks = StackCapture::native;
  HistoryRecorder recorder(allocator, options);
  void* weights = diff_weights_site(allocator, 64 * MiB);
  void* extra = nullptr;
  for (int step = 1; step <= 2; ++step) {
    recorder.annotate_begin("step");
    void* activation = diff_activation_site(allocator, (b ? 40 : 32) * MiB);
    if (!b && step == 1) allocator.deallocate(diff_scratch_site(allocator, 512 * 1024));
    if (b && step == 2) {
      recorder.annotate_begin("extra");
      extra = diff_extra_site(allocator, 16 * MiB);
      recorder.annotate_end();
    }
    allocator.deallocate(activation);
    recorder.annotate_end();
  }
  Run run{recorder.take_snapshot(), allocator.stats()};
  if (extra) allocator.deallocate(extra);
  allocator.deallocate(weights);
  return run;
}

analyzer::RunSummary summary(const snapshot::Snapshot& snap, const std::string& name) {
  analyzer::SnapshotEvents source(snap);
  analyzer::RunSummary run = analyzer::summarize(source, analyzer::SummaryOptions{});
  run.file = name;
  return run;
}

const analyzer::Table& table(const analyzer::Document& doc, const std::string& key) {
  for (const analyzer::Section& s : doc.sections)
    if (const auto* t = std::get_if<analyzer::Table>(&s); t && t->key == key) return *t;
  FAIL("no table " << key);
  throw 0;
}

std::size_t column(const analyzer::Table& t, const std::string& key) {
  for (std::size_t i = 0; i < t.columns.size(); ++i)
    if (t.columns[i].key == key) return i;
  FAIL("no column " << key);
  return 0;
}

// The row whose first cell (or the site's first frame) contains `text`.
const std::vector<analyzer::Value>* row(const analyzer::Table& t, const std::string& text) {
  for (const auto& r : t.rows) {
    for (const analyzer::Value& cell : r) {
      if (const auto* s = std::get_if<std::string>(&cell); s && *s == text) return &r;
      if (const auto* lines = std::get_if<std::vector<std::string>>(&cell);
          lines && !lines->empty() && lines->front().find(text) != std::string::npos)
        return &r;
    }
  }
  return nullptr;
}

std::int64_t signed_cell(const std::vector<analyzer::Value>& r, std::size_t i) { return std::get<std::int64_t>(r[i]); }
std::uint64_t unsigned_cell(const std::vector<analyzer::Value>& r, std::size_t i) { return std::get<std::uint64_t>(r[i]); }

std::string rendered(const analyzer::Document& doc, analyzer::Format format) {
  std::ostringstream out;
  analyzer::render(doc, format, out);
  return out.str();
}

Json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return analyzer::testing::parse_json(text.str());
}

}  // namespace

TEST_CASE("given run B = run A with a grown, a new and a gone site, when diffed, then the peaks move by the allocator's own figures") {
  std::vector<Run> runs;
  for (const bool b : {false, true}) runs.push_back(record(b));
  const analyzer::RunSummary a = summary(runs[0].snapshot, "A");
  const analyzer::RunSummary b = summary(runs[1].snapshot, "B");
  // The summaries' peaks are the allocator's.
  CHECK(a.peak_allocated == static_cast<std::uint64_t>(runs[0].stats.allocated_bytes[stat_all].peak));
  CHECK(b.peak_allocated == static_cast<std::uint64_t>(runs[1].stats.allocated_bytes[stat_all].peak));
  CHECK(a.peak_reserved == static_cast<std::uint64_t>(runs[0].stats.reserved_bytes[stat_all].peak));
  CHECK(b.peak_reserved == static_cast<std::uint64_t>(runs[1].stats.reserved_bytes[stat_all].peak));
  const analyzer::Document doc = analyzer::diff_report(a, b, analyzer::DiffOptions{});
  const analyzer::Table& peaks = table(doc, "peaks");
  const std::size_t change = column(peaks, "change");
  // By construction: A peaks at 64 + 32 + 0.5 MiB allocated, B at 64 + 40 + 16 MiB.
  REQUIRE(row(peaks, "peak_allocated"));
  CHECK(signed_cell(*row(peaks, "peak_allocated"), change) == std::int64_t(120 * MiB) - std::int64_t(96 * MiB + 512 * 1024));
  // Reserved: A's 64 + 32 MiB segments and a 2 MiB small-pool segment; B's 64 + 40 + 16 MiB.
  CHECK(signed_cell(*row(peaks, "peak_reserved"), change) ==
        runs[1].stats.reserved_bytes[stat_all].peak - runs[0].stats.reserved_bytes[stat_all].peak);
  CHECK(signed_cell(*row(peaks, "peak_reserved"), change) == std::int64_t(120 * MiB) - std::int64_t(98 * MiB));
  const analyzer::Table& counts = table(doc, "counts");
  CHECK(signed_cell(*row(counts, "device_allocs"), column(counts, "change")) ==
        runs[1].stats.num_device_alloc - runs[0].stats.num_device_alloc);
}

TEST_CASE("given the same runs, when diffed, then sites match by their frames: grown, new and gone by their exact bytes") {
  std::vector<Run> runs;
  for (const bool b : {false, true}) runs.push_back(record(b));
  const analyzer::Document doc =
      analyzer::diff_report(summary(runs[0].snapshot, "A"), summary(runs[1].snapshot, "B"), analyzer::DiffOptions{});
  const analyzer::Table& sites = table(doc, "sites");
  const std::size_t what = column(sites, "change"), delta = column(sites, "bytes_change");
  const auto* activation = row(sites, "diff_activation_site");
  const auto* extra = row(sites, "diff_extra_site");
  const auto* scratch = row(sites, "diff_scratch_site");
  REQUIRE(activation);
  REQUIRE(extra);
  REQUIRE(scratch);
  // At the allocated peaks: activations 32 -> 40 MiB, extra 0 -> 16 MiB, scratch 0.5 MiB -> absent.
  CHECK(std::get<std::string>((*activation)[what]) == "grown");
  CHECK(signed_cell(*activation, delta) == std::int64_t(8 * MiB));
  CHECK(std::get<std::string>((*extra)[what]) == "new");
  CHECK(signed_cell(*extra, delta) == std::int64_t(16 * MiB));
  CHECK(std::get<std::string>((*scratch)[what]) == "gone");
  CHECK(signed_cell(*scratch, delta) == -std::int64_t(512 * 1024));
  // The weights did not change: matched across the runs, and not listed.
  CHECK(row(sites, "diff_weights_site") == nullptr);
  // Largest change first.
  CHECK(sites.rows.front() == *extra);
  // Allocation counts per site: two activations in each run.
  CHECK(unsigned_cell(*activation, column(sites, "a_allocations")) == 2);
  CHECK(unsigned_cell(*activation, column(sites, "b_allocations")) == 2);
}

TEST_CASE("given the same runs, when diffed, then phases compare by name and occurrence, and a phase only in B says so") {
  std::vector<Run> runs;
  for (const bool b : {false, true}) runs.push_back(record(b));
  const analyzer::Document doc =
      analyzer::diff_report(summary(runs[0].snapshot, "A"), summary(runs[1].snapshot, "B"), analyzer::DiffOptions{});
  const analyzer::Table& phases = table(doc, "phases");
  REQUIRE(phases.rows.size() == 3);
  const std::size_t a_peak = column(phases, "a_peak_allocated"), b_peak = column(phases, "b_peak_allocated");
  const std::size_t in = column(phases, "in"), occurrence = column(phases, "occurrence");
  // step #1: weights + activation (+ scratch in A); step #2: weights + activation (+ extra in B).
  CHECK(std::get<std::string>(phases.rows[0][0]) == "step");
  CHECK(unsigned_cell(phases.rows[0], occurrence) == 1);
  CHECK(unsigned_cell(phases.rows[0], a_peak) == 96 * MiB + 512 * 1024);
  CHECK(unsigned_cell(phases.rows[0], b_peak) == 104 * MiB);
  CHECK(unsigned_cell(phases.rows[1], occurrence) == 2);
  CHECK(unsigned_cell(phases.rows[1], a_peak) == 96 * MiB);
  CHECK(unsigned_cell(phases.rows[1], b_peak) == 120 * MiB);
  CHECK(signed_cell(phases.rows[1], column(phases, "peak_allocated_change")) == std::int64_t(24 * MiB));
  CHECK(std::get<std::string>(phases.rows[2][0]) == "step/extra");
  CHECK(std::get<std::string>(phases.rows[2][in]) == "B only");
  CHECK(std::holds_alternative<std::monostate>(phases.rows[2][a_peak]));  // unknown, not 0
  CHECK(unsigned_cell(phases.rows[2], column(phases, "b_allocations")) == 1);
  // Every format renders it; JSON has null, never 0, for A's side of B's phase.
  const std::string json = rendered(doc, analyzer::Format::json);
  const Json parsed = analyzer::testing::parse_json(json);
  CHECK(std::holds_alternative<std::nullptr_t>(parsed["phases"].array()[2]["a_peak_allocated"].value));
  CHECK(std::get<std::string>(parsed["sites"].array()[0]["change"].value) == "new");
  std::ostringstream csv;
  analyzer::render_csv_table(doc, "phases", csv);
  CHECK(csv.str().find("step/extra,1,B only,,") != std::string::npos);
  CHECK(rendered(doc, analyzer::Format::table).find("+16.00 MiB") != std::string::npos);
}

TEST_CASE("given a run diffed with itself, then nothing changed: every change is 0 and no site is listed") {
  const Run run = record(true);
  const analyzer::RunSummary s = summary(run.snapshot, "B");
  const analyzer::Document doc = analyzer::diff_report(s, s, analyzer::DiffOptions{});
  for (const auto& r : table(doc, "peaks").rows) CHECK(std::get<std::int64_t>(r[3]) == 0);
  CHECK(table(doc, "sites").rows.empty());
  for (const auto& r : table(doc, "phases").rows) CHECK(std::get<std::string>(r[2]) == "both");
}

TEST_CASE("given two real PyTorch runs, when diffed, then the peaks and each shared phase's peaks are PyTorch's") {
  // stacks_all (a conv net) and stacks_python (a GRU): both start with an 'init' step.
  const snapshot::Snapshot snap_a = analyzer::load(kCorpus / "stacks_all.pickle");
  const snapshot::Snapshot snap_b = analyzer::load(kCorpus / "stacks_python.pickle");
  const Json stats_a = read_json(kCorpus / "stacks_all.stats.json");
  const Json stats_b = read_json(kCorpus / "stacks_python.stats.json");
  const analyzer::Document doc =
      analyzer::diff_report(summary(snap_a, "A"), summary(snap_b, "B"), analyzer::DiffOptions{});
  const auto dump = [](const Json& stats, const char* key) {
    return static_cast<std::int64_t>(stats["dump"][key].number());
  };
  const analyzer::Table& peaks = table(doc, "peaks");
  CHECK(signed_cell(*row(peaks, "peak_reserved"), 3) ==
        dump(stats_b, "reserved_bytes.all.peak") - dump(stats_a, "reserved_bytes.all.peak"));
  CHECK(signed_cell(*row(peaks, "peak_allocated"), 3) ==
        dump(stats_b, "allocated_bytes.all.peak") - dump(stats_a, "allocated_bytes.all.peak"));
  CHECK(signed_cell(*row(peaks, "reserved_at_end"), 3) ==
        dump(stats_b, "reserved_bytes.all.current") - dump(stats_a, "reserved_bytes.all.current"));
  const analyzer::Table& counts = table(doc, "counts");
  CHECK(signed_cell(*row(counts, "segments_at_end"), 3) ==
        dump(stats_b, "segment.all.current") - dump(stats_a, "segment.all.current"));
  CHECK(signed_cell(*row(counts, "device_allocs"), 3) ==
        dump(stats_b, "num_device_alloc") - dump(stats_a, "num_device_alloc"));
  // The 'init' step of each: its peaks since the step began (reset_peak_memory_stats at its start).
  const auto step = [](const Json& stats, const std::string& name, const char* key) {
    for (std::size_t i = 0; i < stats["steps"].array().size(); ++i)
      if (std::get<std::string>(stats["steps"].array()[i]["name"].value) == name) return static_cast<std::uint64_t>(stats["steps"].array()[i]["stats"][key].number());
    FAIL("no step " << name);
    return std::uint64_t{0};
  };
  const analyzer::Table& phases = table(doc, "phases");
  const auto* init = row(phases, "init");
  REQUIRE(init);
  CHECK(std::get<std::string>((*init)[column(phases, "in")]) == "both");
  CHECK(unsigned_cell(*init, column(phases, "a_peak_allocated")) == step(stats_a, "init", "allocated_bytes.all.peak"));
  CHECK(unsigned_cell(*init, column(phases, "b_peak_allocated")) == step(stats_b, "init", "allocated_bytes.all.peak"));
  CHECK(unsigned_cell(*init, column(phases, "a_peak_reserved")) == step(stats_a, "init", "reserved_bytes.all.peak"));
  CHECK(unsigned_cell(*init, column(phases, "b_peak_reserved")) == step(stats_b, "init", "reserved_bytes.all.peak"));
  CHECK(unsigned_cell(*init, column(phases, "a_allocated_at_end")) == step(stats_a, "init", "allocated_bytes.all.current"));
  // A's train_0 is not B's: only in A.
  const auto* train = row(phases, "train_0");
  REQUIRE(train);
  CHECK(std::get<std::string>((*train)[column(phases, "in")]) == "A only");
  // Sites are Python frames of the user's script, never torch::unwind.
  const std::string text = rendered(doc, analyzer::Format::table);
  CHECK(text.find("torch::unwind") == std::string::npos);
  CHECK(text.find("make_corpus.py") != std::string::npos);
}

TEST_CASE("given a PyTorch run diffed with itself, then every step is matched to itself with PyTorch's step peaks") {
  const snapshot::Snapshot snap = analyzer::load(kCorpus / "varlen_transformer.pickle");
  const Json stats = read_json(kCorpus / "varlen_transformer.stats.json");
  const analyzer::RunSummary s = summary(snap, "A");
  std::size_t checked = 0;
  for (std::size_t i = 0; i < stats["steps"].array().size(); ++i) {
    const std::string name = std::get<std::string>(stats["steps"].array()[i]["name"].value);
    for (const analyzer::PhaseSummary& p : s.phases) {
      if (p.name != name || p.occurrence != 1) continue;
      CAPTURE(name);
      CHECK(p.peak_allocated == static_cast<std::uint64_t>(stats["steps"].array()[i]["stats"]["allocated_bytes.all.peak"].number()));
      CHECK(p.peak_reserved == static_cast<std::uint64_t>(stats["steps"].array()[i]["stats"]["reserved_bytes.all.peak"].number()));
      CHECK(p.allocated_at_end == static_cast<std::uint64_t>(stats["steps"].array()[i]["stats"]["allocated_bytes.all.current"].number()));
      ++checked;
    }
  }
  CHECK(checked == stats["steps"].array().size());
}

TEST_CASE("given any recording, diff's fragmentation at the reserved peak is the replay report's, read at the same moment") {
  // One name per quantity: `replay` prints "fragmentation at the peak" of the recorded run.
  for (const std::filesystem::path& file :
       {std::filesystem::path(CACHEALLOC_SOURCE_DIR) / "analyzer" / "testdata" / "small_step.bin",
        std::filesystem::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "synthetic_2k_native.bin", kCorpus / "streams.pickle",
        kCorpus / "expandable_maxsplit.pickle"}) {
    CAPTURE(file);
    const snapshot::Snapshot snap = analyzer::load(file);
    analyzer::SnapshotEvents source(snap);
    const analyzer::RunSummary s = analyzer::summarize(source, analyzer::SummaryOptions{});
    REQUIRE(s.fragmentation_at_peak.has_value());
    CHECK(*s.fragmentation_at_peak == doctest::Approx(analyzer::replay_allocator(source).recorded.fragmentation_at_peak));
    CHECK(*s.fragmentation_at_peak > 0);
  }
}

TEST_CASE("diff of a real run against one begun mid-run: the phases that ended before the mid-run one's first memory "
          "event have no figures there, and the later ones do") {
  // Given a real run recorded from its start (A) and one whose ring
  // overflowed, which keeps annotations older than its first memory event (B)
  const std::filesystem::path long_runs = std::filesystem::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "pytorch" / "long";
  analyzer::FileEvents a_file(long_runs / "long_train.pickle.zst"), b_file(long_runs / "long_ring_overflow.pickle.zst");
  analyzer::SummaryOptions options;
  options.phases = true;
  const analyzer::RunSummary a = analyzer::summarize(a_file, options);
  const analyzer::RunSummary b = analyzer::summarize(b_file, options);
  const analyzer::Analysis b_analysis = analyzer::analyze(b_file, analyzer::AnalysisOptions{});
  REQUIRE(b_analysis.ring_begins_at != 0);
  // When they are compared
  const Json doc = analyzer::testing::parse_json([&] {
    std::ostringstream out;
    analyzer::render(analyzer::diff_report(a, b, analyzer::DiffOptions{}), analyzer::Format::json, out);
    return out.str();
  }());
  // Then each of B's phases that ended before that event is marked, and its
  // row has no B figures; a phase both runs recorded has both
  std::size_t before = 0, after = 0;
  for (const analyzer::PhaseSummary& p : b.phases) {
    CHECK(p.before_ring == (p.end_event != analyzer::kNoEvent && p.end_event < b_analysis.ring_begins_at));
    (p.before_ring ? before : after) += 1;
  }
  CHECK(before > 100);
  CHECK(after > 10);
  std::size_t unknown_rows = 0, known_rows = 0;
  for (const Json& row : doc["phases"].array()) {
    if (std::get<std::string>(row["in"].value) != "both") continue;
    if (std::holds_alternative<std::nullptr_t>(row["b_peak_allocated"].value)) {
      CHECK(std::holds_alternative<std::nullptr_t>(row["peak_allocated_change"].value));
      CHECK(std::holds_alternative<std::nullptr_t>(row["b_allocations"].value));
      ++unknown_rows;
    } else {
      CHECK(row["b_peak_allocated"].number() > 0);
      ++known_rows;
    }
  }
  CHECK(unknown_rows > 100);
  CHECK(known_rows > 10);
  bool noted = false;
  for (const Json& note : doc["notes"].array()) noted |= std::get<std::string>(note.value).find("of B's phases ended before") != std::string::npos;
  CHECK(noted);
  // And A, recorded from its start, has none so marked
  for (const analyzer::PhaseSummary& p : a.phases) CHECK_FALSE(p.before_ring);
}
