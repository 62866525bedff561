// Ground truth: the analyzer's figures on real PyTorch 2.11 snapshots equal
// what PyTorch's own torch.cuda.memory_stats() said, at the dump and at the
// end of every step of the run, and its peaks inside each step equal
// PyTorch's peaks after reset_peak_memory_stats() at the step's start.
// The corpus (testdata/pytorch/corpus) was made on an NVIDIA H200 by
// testdata/pytorch/make_corpus.py, which documents how steps line up with
// the snapshot's annotations.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/load.hpp"
#include "cachealloc/analyzer/reports.hpp"
#include "cachealloc/snapshot/pickle.hpp"
#include "../analyzer/testing/parsers.hpp"
#include "compressed_text.hpp"

using namespace cachealloc;
using analyzer::testing::Json;
using snapshot::EventKind;

namespace {

const std::filesystem::path kCorpus = std::filesystem::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "pytorch" / "corpus";
// The long runs (tens of thousands of events each, one beginning mid-run),
// their pickles and stats zstd-compressed.
const std::filesystem::path kLongRuns = kCorpus.parent_path() / "long";

// A file's text; a .zst file decompressed.
std::string read_text(const std::filesystem::path& path) {
  if (path.extension() == ".zst") return cachealloc::testing::zstd_text(path);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Json read_json(const std::filesystem::path& path) { return analyzer::testing::parse_json(read_text(path)); }

std::uint64_t figure(const Json& stats, const std::string& key) {
  return static_cast<std::uint64_t>(stats[key].number());
}

// The cases of a folder: NAME for each NAME.stats.json (or NAME.stats.json.zst,
// beside NAME.pickle.zst).
std::vector<std::string> corpus_cases(const std::filesystem::path& folder = kCorpus) {
  std::vector<std::string> names;
  for (const auto& file : std::filesystem::directory_iterator(folder)) {
    std::string name = file.path().filename().string();
    if (name.ends_with(".zst")) name.resize(name.size() - 4);
    const std::string suffix = ".stats.json";
    if (name.size() > suffix.size() && name.ends_with(suffix)) names.push_back(name.substr(0, name.size() - suffix.size()));
  }
  std::sort(names.begin(), names.end());
  return names;
}

struct CaseFiles {
  std::filesystem::path pickle, stats;
};

CaseFiles case_files(const std::filesystem::path& folder, const std::string& name) {
  const bool packed = folder == kLongRuns;
  return {folder / (name + (packed ? ".pickle.zst" : ".pickle")), folder / (name + (packed ? ".stats.json.zst" : ".stats.json"))};
}

// The index of the annotation event of `kind` named `name` (the first one).
std::size_t annotation(const snapshot::Snapshot& snap, EventKind kind, const std::string& name) {
  for (std::size_t i = 0; i < snap.events.size(); ++i) {
    const auto& e = snap.events[i];
    if (e.kind == kind && e.aux < snap.strings.size() && snap.strings[e.aux] == name) return i;
  }
  return analyzer::kNoEvent;
}

std::size_t first_trace_event(const snapshot::Snapshot& snap) {
  for (std::size_t i = 0; i < snap.events.size(); ++i) {
    const EventKind kind = snap.events[i].kind;
    if (kind != EventKind::annotation_begin && kind != EventKind::annotation_end) return i;
  }
  return snap.events.size();
}

// One figure compared: exact, or, where the analysis says it can only be a
// bound, a bound that holds.
struct Compared {
  enum Kind { exact_or_lower_bound, exact_only };
  std::string what;
  std::uint64_t ours;
  std::uint64_t pytorch;
  // exact_only: no bound is claimed when the trace begins mid-run (the
  // derived start can hold more split free blocks than there were).
  Kind kind = exact_or_lower_bound;
};

void check_current(const analyzer::Analysis& a, const Json& stats, std::vector<Compared>& out) {
  out.push_back({"allocated", a.totals_at_end.allocated, figure(stats, "allocated_bytes.all.current")});
  out.push_back({"reserved", a.totals_at_end.reserved, figure(stats, "reserved_bytes.all.current")});
  out.push_back({"active", a.totals_at_end.active, figure(stats, "active_bytes.all.current")});
  out.push_back({"requested", a.totals_at_end.requested, figure(stats, "requested_bytes.all.current")});
  out.push_back({"inactive_split", a.cache_at_end.inactive_split, figure(stats, "inactive_split_bytes.all.current")});
  out.push_back({"segments", a.totals_at_end.segments, figure(stats, "segment.all.current")});
  out.push_back({"device_allocs", a.device_allocs(), figure(stats, "num_device_alloc")});
  out.push_back({"device_frees", a.device_frees(), figure(stats, "num_device_free")});
}

void check_peaks(const analyzer::Analysis& a, const Json& stats, std::vector<Compared>& out) {
  out.push_back({"peak allocated", a.peak_allocated.bytes, figure(stats, "allocated_bytes.all.peak")});
  out.push_back({"peak reserved", a.peak_reserved.bytes, figure(stats, "reserved_bytes.all.peak")});
  out.push_back({"peak active", a.peak_active.bytes, figure(stats, "active_bytes.all.peak")});
  out.push_back({"peak requested", a.peak_requested.bytes, figure(stats, "requested_bytes.all.peak")});
  out.push_back({"peak inactive_split", a.peak_inactive_split.bytes, figure(stats, "inactive_split_bytes.all.peak"),
                 Compared::exact_only});
  out.push_back({"peak segments", a.peak_segments, figure(stats, "segment.all.peak")});
}

}  // namespace

// Every case of `folder`: the figures at the dump, at the end of every step,
// and the peaks inside every step. Returns the steps compared.
std::size_t check_every_step(const std::filesystem::path& folder, const std::vector<std::string>& cases) {
  std::size_t steps_compared = 0;
  for (const std::string& name : cases) {
    CAPTURE(name);
    // given PyTorch's snapshot and its own figures
    const CaseFiles files = case_files(folder, name);
    const Json truth = read_json(files.stats);
    const snapshot::Snapshot snap = analyzer::load(files.pickle);
    // when the analyzer replays it to the dump, and to the end of each step
    std::vector<Compared> compared;
    analyzer::AnalysisOptions whole;
    const analyzer::Analysis at_dump = analyze(snap, whole);
    const bool bounded = at_dump.truncated();
    check_current(at_dump, truth["dump"], compared);
    for (const Json& step : truth["steps"].array()) {
      const std::string step_name = std::get<std::string>(step["name"].value);
      const std::size_t begin = annotation(snap, EventKind::annotation_begin, step_name);
      const std::size_t end = annotation(snap, EventKind::annotation_end, step_name);
      CAPTURE(step_name);
      // A step that ended before the ring's first trace entry (its
      // annotations outlive the ring) describes a moment the trace does not
      // hold: nothing there is known, not even a bound.
      if (bounded && (begin == analyzer::kNoEvent || end == analyzer::kNoEvent || end < first_trace_event(snap))) continue;
      REQUIRE(begin != analyzer::kNoEvent);
      REQUIRE(end != analyzer::kNoEvent);
      analyzer::AnalysisOptions to_end;
      to_end.window = {0, end + 1};
      std::vector<Compared> here;
      check_current(analyze(snap, to_end), step["stats"], here);
      analyzer::AnalysisOptions inside;
      inside.window = {begin, end + 1};
      check_peaks(analyze(snap, inside), step["stats"], here);
      for (Compared& c : here) c.what = step_name + ": " + c.what;
      compared.insert(compared.end(), here.begin(), here.end());
      ++steps_compared;
    }
    // then each equals PyTorch's; where the trace cannot tell (it began
    // mid-run) the figure is marked a bound and the bound holds
    for (const Compared& c : compared) {
      CAPTURE(c.what);
      if (bounded) {
        if (c.kind == Compared::exact_or_lower_bound) CHECK(c.ours <= c.pytorch);
      } else {
        CHECK(c.ours == c.pytorch);
      }
    }
    if (bounded) {
      // the layout at the dump is PyTorch's own, so figures there are exact
      CHECK(at_dump.totals_at_end.allocated == figure(truth["dump"], "allocated_bytes.all.current"));
      CHECK(at_dump.totals_at_end.reserved == figure(truth["dump"], "reserved_bytes.all.current"));
    }
  }
  return steps_compared;
}

TEST_CASE("every figure at the dump and at every step of every real PyTorch run equals memory_stats()") {
  const std::vector<std::string> cases = corpus_cases();
  REQUIRE(cases.size() >= 13);
  check_every_step(kCorpus, cases);
}

TEST_CASE("every figure at every step of the long real runs equals memory_stats(), mid-run ones included") {
  // given the five long runs: 157k-180k events each, 300-340 steps, one whose
  // ring overflowed (its steps before the ring's first entry are left out)
  const std::vector<std::string> cases = corpus_cases(kLongRuns);
  REQUIRE(cases.size() == 5);
  // when the analyzer replays each to the end of every step, then each figure is PyTorch's
  const std::size_t steps = check_every_step(kLongRuns, cases);
  MESSAGE("long runs: ", steps, " steps compared with memory_stats()");
  CHECK(steps >= 4 * 300 + 30);
}

TEST_CASE("the corpus covers what the figures depend on: a ring overflow, an OOM, expandable segments, streams") {
  // given the corpus as made on the H200
  const std::vector<std::string> cases = corpus_cases();
  // then the cases the issue lists are there, and only ring_overflow is a bound
  for (const char* name : {"stacks_all", "stacks_python", "no_context", "expandable", "expandable_maxsplit", "streams",
                           "ring_overflow", "oom_retry", "empty_cache_mid", "roundup_gc", "roundup_list", "cuda_graph",
                           "varlen_transformer"}) {
    CAPTURE(name);
    REQUIRE(std::find(cases.begin(), cases.end(), name) != cases.end());
    const analyzer::Analysis a = analyzer::analyze(analyzer::load(kCorpus / (std::string(name) + ".pickle")), analyzer::AnalysisOptions{});
    CHECK(a.truncated() == (std::string(name) == "ring_overflow"));
    CHECK(a.anomalies.total() == 0);
    CHECK(a.layout_check.differences == 0);
  }
}

TEST_CASE("where a figure is a bound, every format says so: >= in tables, lower_bounds in JSON") {
  // given the run whose ring overflowed, and one whose trace is whole
  for (const char* name : {"ring_overflow", "stacks_python"}) {
    CAPTURE(name);
    const snapshot::Snapshot snap = analyzer::load(kCorpus / (std::string(name) + ".pickle"));
    // when its summary is rendered
    const analyzer::Document summary = analyzer::summary_report(snap, analyzer::ReportOptions{});
    std::ostringstream table;
    std::ostringstream json;
    analyzer::render(summary, analyzer::Format::table, table);
    analyzer::render(summary, analyzer::Format::json, json);
    const Json parsed = analyzer::testing::parse_json(json.str());
    bool peak_is_bound = false;
    for (const Json& key : parsed["lower_bounds"].array())
      peak_is_bound |= std::get<std::string>(key.value) == "peak_allocated";
    // then the peaks are marked as bounds exactly when they are
    const bool bounded = std::string(name) == "ring_overflow";
    CHECK(peak_is_bound == bounded);
    CHECK((table.str().find("lower bounds") != std::string::npos) == bounded);
    // and PyTorch does not count what its ring dropped, nor store its ring's
    // size: unknown (null), not 0, whether the trace begins mid-run or not
    CHECK(std::holds_alternative<std::nullptr_t>(parsed["dropped_events"].value));
    const std::string text = table.str();
    const std::size_t row = text.find("events lost to ring overflow");
    REQUIRE(row != std::string::npos);
    const std::string line = text.substr(row, text.find('\n', row) - row);
    CHECK(line.ends_with(" unknown"));
  }
}

TEST_CASE("the older PyTorch snapshots in testdata/pytorch give PyTorch's figures at their dump") {
  const std::filesystem::path dir = kCorpus.parent_path();
  for (const char* name : {"cnn_train_stacks_all", "gru_python_stacks", "no_context", "ring_overflow",
                           "varlen_expandable_maxsplit"}) {
    CAPTURE(name);
    // given a pickle and the memory_stats() taken right after its dump
    const Json truth = read_json(dir / (std::string(name) + ".stats.json"));
    // when the whole trace is analyzed
    const analyzer::Analysis a = analyzer::analyze(analyzer::load(dir / (std::string(name) + ".pickle")), analyzer::AnalysisOptions{});
    // then the figures at the end are PyTorch's, and the peaks are too, or are lower bounds that hold
    CHECK(a.totals_at_end.allocated == figure(truth, "allocated_bytes.all.current"));
    CHECK(a.totals_at_end.reserved == figure(truth, "reserved_bytes.all.current"));
    CHECK(a.totals_at_end.inactive_split == figure(truth, "inactive_split_bytes.all.current"));
    CHECK(a.totals_at_end.segments == figure(truth, "segment.all.current"));
    const bool bounded = a.truncated();
    CHECK(bounded == (std::string(name) == "ring_overflow"));
    for (const auto& [ours, key] : {std::pair{a.peak_allocated.bytes, "allocated_bytes.all.peak"},
                                    std::pair{a.peak_reserved.bytes, "reserved_bytes.all.peak"},
                                    std::pair{a.peak_active.bytes, "active_bytes.all.peak"},
                                    std::pair{a.peak_requested.bytes, "requested_bytes.all.peak"}}) {
      CAPTURE(std::string(key));
      if (!truth.has(key)) continue;  // varlen_expandable_maxsplit's stats were taken without it
      if (bounded) {
        CHECK(ours <= figure(truth, key));
      } else {
        CHECK(ours == figure(truth, key));
      }
    }
    if (!bounded) {
      CHECK(a.device_allocs() == figure(truth, "num_device_alloc"));
      CHECK(a.device_frees() == figure(truth, "num_device_free"));
    }
  }
}

TEST_CASE("releasable by empty_cache is what PyTorch's empty_cache() gave back at the dump, expandable segments too") {
  // testdata/pytorch/empty_cache: make_snapshots.py runs on the H200 that called
  // empty_cache() right after the dump and kept memory_reserved() after it.
  const std::filesystem::path dir = kCorpus.parent_path() / "empty_cache";
  int expandable = 0;
  for (const char* name : {"cnn_train_stacks_all", "varlen_default", "varlen_expandable_segments_True",
                           "varlen_expandable_segments_True_max_split_size_mb_64"}) {
    CAPTURE(name);
    // given a pickle, and PyTorch's reserved bytes before and after its empty_cache()
    const Json truth = read_json(dir / (std::string(name) + ".stats.json"));
    const std::uint64_t released =
        figure(truth, "reserved_bytes.all.current") - figure(truth, "reserved_bytes_after_empty_cache");
    // when the trace is analyzed
    const snapshot::Snapshot snap = analyzer::load(dir / (std::string(name) + ".pickle"));
    const analyzer::Analysis a = analyzer::analyze(snap, analyzer::AnalysisOptions{});
    // then the figure at the end is the bytes PyTorch gave back, and the
    // fragmentation report's segments add up to it
    CHECK(a.totals_at_end.reserved == figure(truth, "reserved_bytes.all.current"));
    CHECK(a.cache_at_end.releasable == released);
    std::ostringstream text;
    analyzer::render(analyzer::fragmentation_report(snap, analyzer::ReportOptions{}), analyzer::Format::json, text);
    const Json report = analyzer::testing::parse_json(text.str());
    std::uint64_t by_segment = 0;
    for (const Json& segment : report["segments"].array()) by_segment += figure(segment, "releasable_by_empty_cache");
    CHECK(by_segment == released);
    CHECK(figure(report, "releasable_by_empty_cache") == released);
    // In an expandable segment that still holds blocks, free whole chunks
    // count: the cached bytes outside every held segment are less.
    if (std::string(name).find("expandable") != std::string::npos) {
      ++expandable;
      CHECK(released > 0);
      CHECK(released < a.cache_at_end.cached_free);
    }
  }
  CHECK(expandable == 2);
}

TEST_CASE("a snapshot without allocator_settings (PyTorch before 2.11) gives bounds that hold") {
  // given a real run's pickle with its allocator_settings taken out, as older PyTorch writes them
  // (testdata/pytorch/README.md says how it was made)
  const std::filesystem::path dir = kCorpus.parent_path();
  const snapshot::Snapshot snap = analyzer::load(dir / "corpus_no_settings.pickle");
  const Json truth = read_json(kCorpus / "stacks_python.stats.json");
  // when it is analyzed
  const analyzer::Analysis a = analyzer::analyze(snap, analyzer::AnalysisOptions{});
  // then the policy is said to be assumed, the figures are bounds, and the bounds hold
  CHECK(a.block_policy_assumed);
  CHECK(a.truncated());
  CHECK(a.totals_at_end.allocated == figure(truth["dump"], "allocated_bytes.all.current"));
  CHECK(a.peak_allocated.bytes <= figure(truth["dump"], "allocated_bytes.all.peak"));
}

TEST_CASE("summary's segments are PyTorch's segment count, with expandable segments counted apart") {
  // Given PyTorch's runs with expandable segments (memory_stats() counts none
  // of them; its snapshot lists one per mapped piece) and without.
  const std::filesystem::path dir = std::filesystem::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "pytorch";
  for (const char* name : {"varlen_expandable_maxsplit", "cnn_train_stacks_all", "ring_overflow"}) {
    CAPTURE(name);
    const Json stats = read_json(dir / (std::string(name) + ".stats.json"));
    const snapshot::Snapshot snap = analyzer::load(dir / (std::string(name) + ".pickle"));
    // When summarised, then its segments are PyTorch's segment.all.current,
    // and the expandable ones are counted only when used.
    std::ostringstream json;
    analyzer::render(analyzer::summary_report(snap, analyzer::ReportOptions{}), analyzer::Format::json, json);
    const Json parsed = analyzer::testing::parse_json(json.str());
    const double expandable = parsed["expandable_segments_at_end"].number();
    CHECK(parsed["segments_at_end"].number() == static_cast<double>(figure(stats, "segment.all.current")));
    CHECK((expandable > 0) == (std::string(name) == "varlen_expandable_maxsplit"));
  }
}

TEST_CASE("PyTorch's OOM under a memory fraction the pickle does not record is blamed on a cap, with bounds that hold") {
  // Given PyTorch's run capped at 2 GiB (make_corpus.py: set_per_process_memory_fraction)
  // whose 3 GiB request ran out of memory with 1 GiB reserved and 138 GiB free
  // on the device; PyTorch had already released its cache before raising.
  constexpr double kTrueCap = 2.0 * (1ull << 30);
  const snapshot::Snapshot snap = analyzer::load(kCorpus / "oom_retry.pickle");
  std::ostringstream json;
  analyzer::render(analyzer::oom_report(snap, analyzer::ReportOptions{}), analyzer::Format::json, json);
  const Json parsed = analyzer::testing::parse_json(json.str());
  REQUIRE(parsed["ooms"].array().size() == 1);
  const Json& oom = parsed["ooms"].array()[0];
  // When the OOM report is built, then it is not fragmentation nor real
  // demand but a cap, empty_cache's help is unknown, and the cap's bounds
  // hold PyTorch's 2 GiB.
  CHECK(std::get<std::string>(oom["verdict"].value) == "a cap not in the file");
  CHECK(std::holds_alternative<std::nullptr_t>(oom["empty_cache_helps"].value));
  CHECK(oom["reserved"].number() <= kTrueCap);
  CHECK(oom["reserved"].number() + oom["requested"].number() > kTrueCap);
  std::ostringstream table;
  analyzer::render(analyzer::oom_report(snap, analyzer::ReportOptions{}), analyzer::Format::table, table);
  CHECK(table.str().find("empty_cache() first would have let it succeed") == std::string::npos);
}

namespace {

// `snap`'s trace and layout on device `device`, addresses moved by `shift`,
// without stacks or annotations (their tables stay the other file's).
void move_to_device(snapshot::Snapshot& snap, std::int32_t device, std::uint64_t shift) {
  for (snapshot::Segment& segment : snap.segments) {
    segment.device = device;
    segment.address += shift;
    segment.stack = {};
    for (snapshot::Block& block : segment.blocks) {
      block.address += shift;
      block.stack = {};
    }
  }
  std::erase_if(snap.events, [](const snapshot::Event& e) {
    return e.kind == EventKind::annotation_begin || e.kind == EventKind::annotation_end;
  });
  for (snapshot::Event& e : snap.events) {
    e.device = device;
    e.address += shift;
    e.stack = {};
  }
  for (snapshot::DeviceInfo& info : snap.devices) info.index = device;
}

}  // namespace

TEST_CASE("in one pickle of two devices, each device's figures and bounds are its own: a ring that overflowed on one leaves the other exact") {
  // given a run that began with its trace and one whose ring overflowed, as
  // the two devices of one PyTorch pickle, in either order (each device's
  // trace is sized on its own)
  for (const std::int32_t midrun_device : {1, 0}) {
    const std::int32_t complete_device = 1 - midrun_device;
    CAPTURE(midrun_device);
    snapshot::Snapshot complete = analyzer::load(kLongRuns / "long_rank0.pickle.zst");
    snapshot::Snapshot midrun = analyzer::load(kLongRuns / "long_ring_overflow.pickle.zst");
    move_to_device(complete, complete_device, std::uint64_t(complete_device) << 44);
    move_to_device(midrun, midrun_device, std::uint64_t(midrun_device) << 44);
    // Recorded side by side: the overflowed ring holds the second half of the
    // complete one's time (the other device's events come first).
    const std::uint64_t middle =
        complete.events.front().time_ns + (complete.events.back().time_ns - complete.events.front().time_ns) / 2;
    const std::uint64_t from = midrun.events.front().time_ns;
    for (snapshot::Event& e : midrun.events) e.time_ns = e.time_ns - from + middle;
    snapshot::Snapshot two = complete;
    two.segments.insert(two.segments.end(), midrun.segments.begin(), midrun.segments.end());
    std::sort(two.segments.begin(), two.segments.end(), [](const snapshot::Segment& a, const snapshot::Segment& b) {
      return std::pair(a.device, a.address) < std::pair(b.device, b.address);
    });
    two.devices.insert(two.devices.end(), midrun.devices.begin(), midrun.devices.end());
    std::sort(two.devices.begin(), two.devices.end(),
              [](const snapshot::DeviceInfo& a, const snapshot::DeviceInfo& b) { return a.index < b.index; });
    two.events.clear();
    std::merge(complete.events.begin(), complete.events.end(), midrun.events.begin(), midrun.events.end(),
               std::back_inserter(two.events),
               [](const snapshot::Event& a, const snapshot::Event& b) { return a.time_ns < b.time_ns; });
    auto through_pickle = [](const snapshot::Snapshot& s) {
      return snapshot::decode_pytorch_pickle(snapshot::encode_pytorch_pickle(s));
    };
    const snapshot::Snapshot merged = through_pickle(two);

    // when each device is analyzed in the two-device file and alone
    analyzer::AnalysisOptions options;
    options.device = complete_device;
    const analyzer::Analysis first = analyze(merged, options);
    const analyzer::Analysis first_alone = analyze(through_pickle(complete), analyzer::AnalysisOptions{});
    options.device = midrun_device;
    const analyzer::Analysis second = analyze(merged, options);
    const analyzer::Analysis second_alone = analyze(through_pickle(midrun), analyzer::AnalysisOptions{});

    // then the complete device stays exact, not bounds, and the one whose
    // ring overflowed keeps its inferred sizes: its peaks are its own file's
    CHECK_FALSE(first_alone.truncated());
    CHECK_FALSE(first.truncated());
    CHECK(first.inferred_block_sizes == 0);
    CHECK(first.peak_allocated.bytes == first_alone.peak_allocated.bytes);
    CHECK(first.peak_reserved.bytes == first_alone.peak_reserved.bytes);
    CHECK(second.truncated());
    CHECK(second.inferred_block_sizes != 0);
    CHECK(second.inferred_block_sizes == second_alone.inferred_block_sizes);
    CHECK(second.peak_allocated.bytes == second_alone.peak_allocated.bytes);
    CHECK(second.peak_reserved.bytes == second_alone.peak_reserved.bytes);
    CHECK(second.totals_at_end.allocated == second_alone.totals_at_end.allocated);
    // and the mid-run one's figures start at its own first event, after any
    // earlier events of the other device (its memory then was not recorded);
    // the other's at the file's first event
    const std::size_t own_first = static_cast<std::size_t>(
        std::find_if(merged.events.begin(), merged.events.end(),
                     [&](const snapshot::Event& e) { return e.device == midrun_device; }) -
        merged.events.begin());
    REQUIRE(own_first > 0);
    CHECK(first.ring_begins_at == 0);
    CHECK(first.window.begin == 0);
    CHECK(second.ring_begins_at == own_first);
    CHECK(second.window.begin == own_first);
    REQUIRE(second.peak_reserved.event == analyzer::kNoEvent);  // held from the ring's start
    CHECK(second.peak_reserved.time_ns == merged.events[own_first].time_ns);
  }
}
