// Self-consistency of the what-if replay: replaying each
// recording in testdata/ with its own settings through the real allocator on
// the simulated device reproduces the recorded run's figures exactly. The
// figures come from the recorded run itself, never from our earlier output:
// PyTorch's torch.cuda.memory_stats() (NAME.stats.json, at the dump and, for
// the corpus, at the end of every step with peaks since the step's start) for
// the pickles, and the recorder's own stats at the dump for our snapshots.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "allocator_support.hpp"
#include "cachealloc/analyzer/allocator_replay.hpp"
#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/load.hpp"
#include "cachealloc/analyzer/sweep.hpp"
#include "cachealloc/allocator.hpp"
#include "cachealloc/errors.hpp"
#include "cachealloc/history.hpp"
#include "cachealloc/snapshot/pickle.hpp"
#include "../analyzer/testing/parsers.hpp"
#include "../analyzer/testing/trace_builder.hpp"
#include "compressed_text.hpp"

using namespace cachealloc;
using analyzer::testing::Json;

namespace {

const std::filesystem::path kSource = CACHEALLOC_SOURCE_DIR;
const std::filesystem::path kPytorch = kSource / "testdata" / "pytorch";

Json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return analyzer::testing::parse_json(text.str());
}

std::int64_t number(const Json& stats, const std::string& key) {
  return static_cast<std::int64_t>(stats[key].number());
}

// The figures the issue names, PyTorch's keys beside our stats.
struct Figure {
  const char* key;
  std::int64_t (*of)(const MemoryStats&);
};
const Figure kFigures[] = {
    {"reserved_bytes.all.current", [](const MemoryStats& s) { return s.reserved_bytes[stat_all].current; }},
    {"reserved_bytes.all.peak", [](const MemoryStats& s) { return s.reserved_bytes[stat_all].peak; }},
    {"allocated_bytes.all.current", [](const MemoryStats& s) { return s.allocated_bytes[stat_all].current; }},
    {"allocated_bytes.all.peak", [](const MemoryStats& s) { return s.allocated_bytes[stat_all].peak; }},
    {"segment.all.current", [](const MemoryStats& s) { return s.segment[stat_all].current; }},
    // Active counts a free that waits for another stream's event until it
    // completes, which PyTorch does at any stream's next request.
    {"active_bytes.all.current", [](const MemoryStats& s) { return s.active_bytes[stat_all].current; }},
    {"active_bytes.all.peak", [](const MemoryStats& s) { return s.active_bytes[stat_all].peak; }},
    {"inactive_split_bytes.all.current", [](const MemoryStats& s) { return s.inactive_split_bytes[stat_all].current; }},
    {"num_device_alloc", [](const MemoryStats& s) { return s.num_device_alloc; }},
    {"num_device_free", [](const MemoryStats& s) { return s.num_device_free; }},
    {"num_alloc_retries", [](const MemoryStats& s) { return s.num_alloc_retries; }},
    {"num_ooms", [](const MemoryStats& s) { return s.num_ooms; }},
};

// `before_window`: for a trace begun mid-run, PyTorch's device calls before
// its first event, which the replay cannot count; set at the first step
// checked, then the same at every step.
void check_figures(const MemoryStats& replayed, const Json& expected, const std::string& where,
                   std::map<std::string, std::int64_t>* before_window = nullptr) {
  for (const Figure& f : kFigures) {
    if (!expected.has(f.key)) continue;
    const std::string label = where + ": " + f.key;
    INFO(label);
    const std::string key = f.key;
    if (before_window && key.starts_with("num_device_")) {
      const std::int64_t calls_before = number(expected, f.key) - f.of(replayed);
      CHECK(calls_before >= 0);
      CHECK(before_window->try_emplace(key, calls_before).first->second == calls_before);
      continue;
    }
    CHECK(f.of(replayed) == number(expected, f.key));
  }
}

// Replays `pickle` with the settings it records (and the memory fraction the
// run set, which a pickle does not store). Resets the replay's peaks where
// make_corpus.py reset PyTorch's (just before each step's START annotation)
// and compares every figure at each step's END annotation; then at the end.
//
// A trace that begins mid-run (ring_overflow) is checked from the first step
// that starts inside it: the state before the ring is what the replay rebuilds,
// and PyTorch's figures for earlier steps describe events the file lost. Its
// dump peaks are PyTorch's since the last step's start, which lies inside.
analyzer::ReplayResult replay_corpus_case(const std::filesystem::path& pickle, const Json& stats) {
  const snapshot::Snapshot snap = analyzer::load(pickle);
  std::uint64_t first_trace_time = ~std::uint64_t{0};
  for (const auto& e : snap.events)
    if (e.kind != snapshot::EventKind::annotation_begin && e.kind != snapshot::EventKind::annotation_end) {
      first_trace_time = e.time_ns;
      break;
    }
  const bool mid_run = snap.settings.count("trace_may_begin_mid_run") != 0;
  analyzer::AllocatorReplayOptions options;
  if (stats.has("extra") && stats["extra"].has("memory_fraction")) options.fraction = stats["extra"]["memory_fraction"].number();
  std::map<std::string, const Json*> steps;
  for (const Json& step : stats["steps"].array()) steps[std::get<std::string>(step["name"].value)] = &step["stats"];
  std::map<std::string, bool> seen;
  std::size_t steps_checked = 0;
  std::map<std::string, std::int64_t> calls_before_window;
  MemoryStats at_end;
  options.on_annotation = [&](const snapshot::Event& event, std::string_view name, analyzer::ReplayControl& control) {
    const auto it = steps.find(std::string(name));
    if (it == steps.end()) return;
    if (mid_run && event.time_ns < first_trace_time) {
      if (!seen[it->first]) ++steps_checked;  // before the ring: not in the file
      seen[it->first] = true;
      return;
    }
    if (event.kind == snapshot::EventKind::annotation_begin && !seen[it->first]) {
      control.reset_peak_stats();
    } else if (event.kind == snapshot::EventKind::annotation_end && !seen[it->first]) {
      seen[it->first] = true;
      check_figures(control.stats(), *it->second, pickle.filename().string() + " step " + it->first,
                    mid_run ? &calls_before_window : nullptr);
      ++steps_checked;
    }
  };
  analyzer::SnapshotEvents source(snap);
  const analyzer::ReplayResult result = analyzer::replay_allocator(source, options);
  CHECK(steps_checked == steps.size());
  // The dump: what the last step's reset left of the peaks is PyTorch's
  // "dump" peak; the replay reports its own whole-run peak, which is at least that.
  const Json& dump = stats["dump"];
  const std::string label = pickle.filename().string() + " at the dump";
  INFO(label);
  CHECK(static_cast<std::int64_t>(result.replayed.reserved_at_end) == number(dump, "reserved_bytes.all.current"));
  CHECK(static_cast<std::int64_t>(result.replayed.allocated_at_end) == number(dump, "allocated_bytes.all.current"));
  CHECK(static_cast<std::int64_t>(result.replayed.segments) == number(dump, "segment.all.current"));
  if (result.starts_mid_run) {
    // The window's own device calls; PyTorch's count also holds those before it.
    CHECK(result.replayed.device_allocs == result.recorded.device_allocs);
    CHECK(static_cast<std::int64_t>(result.replayed.device_allocs) <= number(dump, "num_device_alloc"));
  } else {
    CHECK(static_cast<std::int64_t>(result.replayed.device_allocs) == number(dump, "num_device_alloc"));
    CHECK(static_cast<std::int64_t>(result.replayed.device_frees) == number(dump, "num_device_free"));
  }
  CHECK(static_cast<std::int64_t>(*result.replayed.retries) == number(dump, "num_alloc_retries"));
  CHECK(static_cast<std::int64_t>(result.replayed.ooms) == number(dump, "num_ooms"));
  CHECK(static_cast<bool>(result.replayed.first_oom) == (number(dump, "num_ooms") > 0));
  // The replay agrees with the trace's own account of the run.
  CHECK(static_cast<std::int64_t>(result.replayed.peak_reserved) ==
        static_cast<std::int64_t>(result.recorded.peak_reserved));
  CHECK(result.replayed.peak_allocated == result.recorded.peak_allocated);
  // (Not the fragmentation: a pickle's block sizes are inferred from the
  // requests, the replay's are the allocator's own.)
  return result;
}

}  // namespace

TEST_CASE("given each PyTorch corpus run, when replayed with its own settings, then every step's figures equal PyTorch's") {
  std::vector<std::string> names;
  for (const auto& file : std::filesystem::directory_iterator(kPytorch / "corpus"))
    if (file.path().extension() == ".pickle") names.push_back(file.path().stem().string());
  std::sort(names.begin(), names.end());
  REQUIRE(names.size() >= 13);
  for (const std::string& name : names) {
    SUBCASE(name.c_str()) {
      const analyzer::ReplayResult result =
          replay_corpus_case(kPytorch / "corpus" / (name + ".pickle"), read_json(kPytorch / "corpus" / (name + ".stats.json")));
      // Only the capture holds a private pool (torch.cuda.graph's): the
      // figures above hold because its requests were replayed in one.
      CHECK(result.inferred_private_pools == (name == "cuda_graph" ? 1u : 0u));
      // The 24 allocs that the recording served from the four segments
      // reserved from the capture's first request on (by their addresses).
      if (name == "cuda_graph") CHECK(result.private_pool_requests == 24);
    }
  }
}

TEST_CASE("given each PyTorch run, when replayed, then the recorded peak's event is the one summary names") {
  std::vector<std::filesystem::path> files;
  for (const auto& dir : {kPytorch, kPytorch / "corpus"})
    for (const auto& file : std::filesystem::directory_iterator(dir))
      if (file.path().extension() == ".pickle") files.push_back(file.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 18);
  for (const auto& file : files) {
    CAPTURE(file);
    analyzer::FileEvents source(file);
    const analyzer::ReplayResult r = analyzer::replay_allocator(source);
    analyzer::FileEvents again(file);
    const analyzer::Analysis a = analyzer::analyze(again, analyzer::AnalysisOptions{});
    CHECK(r.recorded.peak_reserved == a.peak_reserved.bytes);
    CHECK(r.recorded.peak_reserved_event == a.peak_reserved.event);
  }
}

TEST_CASE("given the long real runs, complete and begun mid-run, when replayed under their own settings, then every "
          "step's figures equal PyTorch's, and every figure of the replay equals the recording's") {
  // Given five real training runs of 150k events and more, with a side
  // stream whose frees wait for the default stream, and one whose ring
  // overflowed (the trace begins mid-run)
  const std::filesystem::path long_runs = kPytorch / "long";
  for (const char* name : {"long_train", "long_rank0", "long_rank1", "long_expandable", "long_ring_overflow"}) {
    CAPTURE(name);
    const std::filesystem::path pickle = long_runs / (std::string(name) + ".pickle.zst");
    const Json stats = analyzer::testing::parse_json(testing::zstd_text(long_runs / (std::string(name) + ".stats.json.zst")));
    // When replayed, then each of its ~300 steps ends with PyTorch's figures, active bytes included
    const analyzer::ReplayResult r = replay_corpus_case(pickle, stats);
    CHECK(r.starts_mid_run == (std::string(name) == "long_ring_overflow"));
    // And the replay, an independent account, gives every figure the trace gives
    const auto& rec = r.recorded;
    const auto& rep = r.replayed;
    CHECK(rep.peak_reserved_event == rec.peak_reserved_event);
    CHECK(rep.cached_free_at_peak == rec.cached_free_at_peak);
    CHECK(rep.largest_free_at_peak == rec.largest_free_at_peak);
    CHECK(rep.segments == rec.segments);
    CHECK(rep.device_allocs == rec.device_allocs);
    CHECK(rep.device_frees == rec.device_frees);
    CHECK(rep.reserved_at_end == rec.reserved_at_end);
    CHECK(rep.allocated_at_end == rec.allocated_at_end);
  }
}

TEST_CASE("given a real run begun mid-run whose start holds more than a cap, when replayed and swept under that cap, "
          "then it runs out of memory before the trace, and no setting is said to fit") {
  // Given a real run whose ring overflowed: 128 MiB reserved at the ring's start
  const std::filesystem::path pickle = kPytorch / "long" / "long_ring_overflow.pickle.zst";
  const snapshot::Snapshot snap = analyzer::load(pickle);
  analyzer::SnapshotEvents source(snap);
  const analyzer::ReplayResult uncapped = analyzer::replay_allocator(source);
  REQUIRE(uncapped.starts_mid_run);
  REQUIRE(uncapped.recorded.peak_reserved_event == analyzer::kNoEvent);  // the peak is the start's
  const std::uint64_t start_reserved = uncapped.recorded.peak_reserved;
  REQUIRE(start_reserved == 128ull << 20);
  // When replayed at a cap below it, and at one above it
  analyzer::AllocatorReplayOptions below;
  below.capacity = 100ull << 20;
  const analyzer::ReplayResult r = analyzer::replay_allocator(source, below);
  analyzer::AllocatorReplayOptions above;
  above.capacity = 130ull << 20;
  const analyzer::ReplayResult fits = analyzer::replay_allocator(source, above);
  // Then below, the replayed run ran out of memory before its first event, by the start's bytes, and a note says so
  REQUIRE(r.replayed.first_oom.has_value());
  CHECK(r.replayed.first_oom->at_start);
  CHECK(r.replayed.first_oom->event == 0);
  CHECK(r.replayed.first_oom->requested == start_reserved);
  CHECK(r.replayed.ooms >= 1);
  CHECK(std::any_of(r.notes.begin(), r.notes.end(), [&](const std::string& n) {
    return n.find("the layout at the ring's start already reserves " + std::to_string(start_reserved) +
                  " bytes, above the replay's cap of " + std::to_string(100ull << 20)) != std::string::npos;
  }));
  std::ostringstream table;
  analyzer::render(analyzer::replay_report(r), analyzer::Format::table, table);
  CHECK(table.str().find("before the trace (its start holds 128.00 MiB, above the cap)") != std::string::npos);
  // And above it, no such OOM
  CHECK(!fits.replayed.first_oom.has_value());
  // And the sweep at the lower cap finds that no setting fits, and says why
  analyzer::SweepOptions sweep_options;
  sweep_options.capacity = 100ull << 20;
  sweep_options.threads = 2;
  analyzer::SnapshotEvents again(snap);
  const analyzer::SweepResult sweep = analyzer::sweep(again, sweep_options);
  for (const analyzer::SweepPoint& point : sweep.ranked) {
    CAPTURE(point.changes);
    CHECK(!point.fits);
    REQUIRE(point.figures.first_oom.has_value());
    CHECK(point.figures.first_oom->at_start);
  }
  const analyzer::Recommendation rec = analyzer::recommend(sweep);
  CHECK(!rec.helps);
  CHECK(rec.verdict.find("before the trace: its start already reserves 128.00 MiB, which no setting changes") !=
        std::string::npos);
}

TEST_CASE("given each PyTorch run and the long real runs, when replayed under their own settings, then the replayed "
          "peak names the event the recorded one names: the reservation, not the request after it") {
  // Given PyTorch's runs, whose traces log each reservation as its own event
  // just before the request that made it.
  std::vector<std::filesystem::path> files;
  for (const auto& dir : {kPytorch, kPytorch / "corpus", kPytorch / "long"})
    for (const auto& file : std::filesystem::directory_iterator(dir))
      if (file.path().extension() == ".pickle" || file.path().string().ends_with(".pickle.zst"))
        files.push_back(file.path());
  std::sort(files.begin(), files.end());
  std::size_t compared = 0;
  for (const auto& file : files) {
    CAPTURE(file);
    analyzer::FileEvents source(file);
    const analyzer::ReplayResult r = analyzer::replay_allocator(source);
    // When the replay reaches the recorded peak (the same moment), then both
    // columns name the same event.
    if (r.replayed.peak_reserved != r.recorded.peak_reserved) continue;
    ++compared;
    CHECK(r.replayed.peak_reserved_event == r.recorded.peak_reserved_event);
  }
  CHECK(compared >= 20);  // the five long runs among them
  // And where the replay reserved for a request that the recording could not
  // serve (its OOM, at a cap the file does not hold), the request is named,
  // and a note says why the columns differ.
  analyzer::FileEvents oom(kPytorch / "corpus" / "oom_retry.pickle");
  const analyzer::ReplayResult r = analyzer::replay_allocator(oom);
  REQUIRE(r.recorded.first_oom);
  CHECK(r.replayed.peak_reserved_event == r.recorded.first_oom->event);
  CHECK(std::any_of(r.notes.begin(), r.notes.end(), [&](const std::string& n) {
    return n.find("peak reserved serving request #" + std::to_string(r.recorded.first_oom->event) +
                  ", for which the recording reserved nothing") != std::string::npos;
  }));
}

TEST_CASE("given a pickle without allocator_settings, when replayed with the defaults, then it matches the run it came from") {
  // corpus_no_settings.pickle is corpus/stacks_python.pickle less its settings (README): that run's figures hold.
  replay_corpus_case(kPytorch / "corpus_no_settings.pickle", read_json(kPytorch / "corpus" / "stacks_python.stats.json"));
}

TEST_CASE("given each PyTorch snapshot beside its stats.json, when replayed, then the dump's figures equal PyTorch's") {
  for (const char* name : {"cnn_train_stacks_all", "gru_python_stacks", "no_context", "ring_overflow",
                           "varlen_expandable_maxsplit"}) {
    SUBCASE(name) {
      const Json stats = read_json(kPytorch / (std::string(name) + ".stats.json"));
      analyzer::FileEvents source(kPytorch / (std::string(name) + ".pickle"));
      const analyzer::ReplayResult r = analyzer::replay_allocator(source);
      INFO(name);
      CHECK(r.initial_blocks_not_rebuilt == 0);
      CHECK(r.joined_fragments == (std::string(name) == "ring_overflow" ? 4u : 0u));
      CHECK(static_cast<std::int64_t>(r.replayed.peak_reserved) == number(stats, "reserved_bytes.all.peak"));
      if (std::string(name) == "ring_overflow") {
        // PyTorch's allocated peak came before the ring's start (1700 of the
        // 2000 allocations are lost): the file does not hold it. The window's
        // own peak is replayed, and it is below PyTorch's.
        CHECK(r.replayed.peak_allocated == r.recorded.peak_allocated);
        CHECK(static_cast<std::int64_t>(r.replayed.peak_allocated) < number(stats, "allocated_bytes.all.peak"));
      } else {
        CHECK(static_cast<std::int64_t>(r.replayed.peak_allocated) == number(stats, "allocated_bytes.all.peak"));
      }
      CHECK(static_cast<std::int64_t>(r.replayed.reserved_at_end) == number(stats, "reserved_bytes.all.current"));
      CHECK(static_cast<std::int64_t>(r.replayed.allocated_at_end) == number(stats, "allocated_bytes.all.current"));
      CHECK(static_cast<std::int64_t>(r.replayed.segments) == number(stats, "segment.all.current"));
      if (std::string(name) == "ring_overflow") {
        // Both columns count the window's own device calls: PyTorch's count
        // also holds those before the ring.
        CHECK(r.replayed.device_allocs == r.recorded.device_allocs);
        CHECK(r.replayed.device_frees == r.recorded.device_frees);
        CHECK(static_cast<std::int64_t>(r.replayed.device_allocs) < number(stats, "num_device_alloc"));
      } else {
        CHECK(static_cast<std::int64_t>(r.replayed.device_allocs) == number(stats, "num_device_alloc"));
        CHECK(static_cast<std::int64_t>(r.replayed.device_frees) == number(stats, "num_device_free"));
      }
      if (std::string(name) != "ring_overflow") {
        // The recorded column counts the trace's device calls as PyTorch
        // does: expandable segments' maps and unmaps included.
        CHECK(static_cast<std::int64_t>(r.recorded.device_allocs) == number(stats, "num_device_alloc"));
        CHECK(static_cast<std::int64_t>(r.recorded.device_frees) == number(stats, "num_device_free"));
      }
      CHECK(static_cast<std::int64_t>(*r.replayed.retries) == number(stats, "num_alloc_retries"));
      CHECK(static_cast<std::int64_t>(r.replayed.ooms) == number(stats, "num_ooms"));
    }
  }
}

TEST_CASE("given each of our snapshots, when replayed with its own settings, then the recorder's figures at the dump hold") {
  // (analyzer/testdata/small_*.bin are not recordings: analyzer/testing/
  // trace_builder.hpp writes their events by hand, without the allocator's policy.)
  for (const auto& path : {kSource / "testdata" / "synthetic_2k_native.bin", kSource / "testdata" / "synthetic_2k_nostacks.bin"}) {
    SUBCASE(path.filename().string().c_str()) {
      const snapshot::Snapshot snap = analyzer::load(path);
      analyzer::SnapshotEvents source(snap);
      const analyzer::ReplayResult r = analyzer::replay_allocator(source);
      const auto& s = snap.stats;
      INFO(path.filename().string());
      CHECK(r.initial_blocks_not_rebuilt == 0);
      REQUIRE(s.count("reserved_bytes.all.peak") == 1);
      CHECK(r.replayed.fragmentation_at_peak == doctest::Approx(r.recorded.fragmentation_at_peak));
      CHECK(r.replayed.ooms == r.recorded.ooms);
      CHECK(static_cast<bool>(r.replayed.first_oom) == static_cast<bool>(r.recorded.first_oom));
      if (r.recorded.first_oom) CHECK(r.replayed.first_oom->event == r.recorded.first_oom->event);
      if (snap.dropped_events == 0) {
        CHECK(r.replayed.peak_reserved == static_cast<std::uint64_t>(s.at("reserved_bytes.all.peak")));
        CHECK(r.replayed.peak_allocated == static_cast<std::uint64_t>(s.at("allocated_bytes.all.peak")));
        CHECK(r.replayed.device_allocs == static_cast<std::uint64_t>(s.at("num_device_alloc")));
        CHECK(r.replayed.device_frees == static_cast<std::uint64_t>(s.at("num_device_free")));
        CHECK(*r.replayed.retries == static_cast<std::uint64_t>(s.at("num_alloc_retries")));
        CHECK(r.replayed.ooms == static_cast<std::uint64_t>(s.at("num_ooms")));
      } else {
        // Peaks and counters of the lost events are not in the file: the window's own.
        CHECK(r.replayed.peak_reserved == r.recorded.peak_reserved);
        CHECK(r.replayed.peak_allocated == r.recorded.peak_allocated);
        CHECK(r.replayed.device_allocs == r.recorded.device_allocs);
        CHECK(r.replayed.device_frees == r.recorded.device_frees);
      }
      CHECK(r.replayed.reserved_at_end == static_cast<std::uint64_t>(s.at("reserved_bytes.all.current")));
      CHECK(r.replayed.allocated_at_end == static_cast<std::uint64_t>(s.at("allocated_bytes.all.current")));
      CHECK(r.replayed.segments == static_cast<std::uint64_t>(s.at("segment.all.current")));
      CHECK(r.placement_diverged == false);
    }
  }
}

TEST_CASE("given a recorded run, when replayed with expandable segments, then the same requests meet expandable segments") {
  const snapshot::Snapshot snap = analyzer::load(kPytorch / "corpus" / "varlen_transformer.pickle");
  analyzer::SnapshotEvents source(snap);
  const analyzer::ReplayResult base = analyzer::replay_allocator(source);
  analyzer::AllocatorReplayOptions options;
  options.set = {"expandable_segments=True"};
  const analyzer::ReplayResult r = analyzer::replay_allocator(source, options);
  CHECK(r.recorded_config.empty());
  CHECK(r.replayed_config == "expandable_segments:True");
  CHECK(r.requests == base.requests);
  CHECK(r.replayed.segments == 0);  // PyTorch counts no expandable segment in segment.all
  CHECK(r.replayed.peak_reserved != base.replayed.peak_reserved);
  CHECK(r.recorded.peak_reserved == base.recorded.peak_reserved);  // the recorded column does not move
}

TEST_CASE("given a capacity below the recorded peak, when replayed, then the replay runs out of memory at a named event") {
  const snapshot::Snapshot snap = analyzer::load(kPytorch / "corpus" / "varlen_transformer.pickle");
  analyzer::SnapshotEvents source(snap);
  analyzer::AllocatorReplayOptions options;
  const analyzer::ReplayResult full = analyzer::replay_allocator(source, options);
  options.capacity = full.recorded.peak_allocated / 2;
  const analyzer::ReplayResult r = analyzer::replay_allocator(source, options);
  REQUIRE(r.replayed.first_oom.has_value());
  CHECK(r.replayed.first_oom->event < snap.events.size());
  CHECK(r.replayed.ooms >= 1);
  CHECK(r.replayed.peak_reserved <= *options.capacity);
  CHECK_FALSE(r.recorded.first_oom.has_value());
}

TEST_CASE("given a bad setting or fraction, when replayed, then a one-line error names it") {
  const snapshot::Snapshot snap = analyzer::load(kPytorch / "corpus" / "stacks_python.pickle");
  analyzer::SnapshotEvents source(snap);
  analyzer::AllocatorReplayOptions options;
  options.set = {"max_split_size_mb=5"};
  CHECK_THROWS_AS(analyzer::replay_allocator(source, options), ConfigError);
  options.set = {"no_such_key=1"};
  CHECK_THROWS_AS(analyzer::replay_allocator(source, options), ConfigError);
  // named as given on the command line, not as CACHEALLOC_CONF text
  CHECK_THROWS_WITH(analyzer::replay_allocator(source, options),
                    doctest::Contains("--set no_such_key=1: unknown option (known: max_split_size_mb"));
  options.set = {"expandable_segments=True", "max_split_size_mb=abc"};
  CHECK_THROWS_WITH(analyzer::replay_allocator(source, options),
                    "--set max_split_size_mb=abc: expected a non-negative integer");
  options.set = {"expandable_segments"};
  CHECK_THROWS_WITH(analyzer::replay_allocator(source, options),
                    "--set expandable_segments: expected KEY=VALUE, a CACHEALLOC_CONF key and its value");
  options.set = {};
  options.fraction = 1.5;
  CHECK_THROWS_AS(analyzer::replay_allocator(source, options), InvalidArgument);
}

TEST_CASE("given a segments-only pickle, when replayed, then it is refused: there is no request stream") {
  const snapshot::Snapshot snap = analyzer::load(kPytorch / "segments_only" / "gru_python_stacks.pickle");
  analyzer::SnapshotEvents source(snap);
  CHECK_THROWS_AS(analyzer::replay_allocator(source), InvalidArgument);
}

namespace {

using test_support::fragmenting_workload;

}  // namespace

TEST_CASE("given a fragmenting run as a PyTorch pickle, when replayed under expandable segments at a cap the recorded "
          "settings cannot meet, then the replay predicts the real run's peak exactly and no OOM") {
  constexpr std::uint64_t kCap = std::uint64_t{11} << 30;
  // The recorded run: default settings, no cap, written as PyTorch writes it.
  snapshot::Snapshot recorded;
  {
    CachingAllocator allocator(make_simulated_device(simulated_h200_options()));
    HistoryOptions options;
    options.stacks = StackCapture::none;
    HistoryRecorder recorder(allocator, options);
    REQUIRE_FALSE(fragmenting_workload(allocator));
    recorded = snapshot::decode_pytorch_pickle(snapshot::encode_pytorch_pickle(recorder.take_snapshot()));
  }
  REQUIRE(recorded.header.source == "pytorch-pickle");
  analyzer::SnapshotEvents source(recorded);
  analyzer::AllocatorReplayOptions options;
  options.capacity = kCap;
  const analyzer::ReplayResult as_recorded = analyzer::replay_allocator(source, options);
  options.set = {"expandable_segments=True"};
  const analyzer::ReplayResult expandable = analyzer::replay_allocator(source, options);
  // The recorded settings run out of memory at the cap; expandable segments do not, with a lower peak.
  REQUIRE(as_recorded.replayed.first_oom.has_value());
  CHECK(as_recorded.recorded.peak_reserved > kCap);
  CHECK_FALSE(expandable.replayed.first_oom.has_value());
  CHECK(expandable.replayed.peak_reserved < as_recorded.recorded.peak_reserved);
  // The "real" runs, on the simulated device, under each setting and the cap.
  auto real = [&](const char* config, MemoryStats& stats) {
    CachingAllocator allocator(make_simulated_device(simulated_h200_options()), parse_config(config));
    allocator.set_memory_fraction(static_cast<double>(kCap) / static_cast<double>(simulated_h200_options().capacity));
    const bool oom = fragmenting_workload(allocator);
    stats = allocator.stats();
    return oom;
  };
  MemoryStats stats;
  CHECK(real("", stats));  // the recorded settings: OOM, as the replay said
  CHECK_FALSE(real("expandable_segments:True", stats));
  CHECK(static_cast<std::uint64_t>(stats.reserved_bytes[stat_all].peak) == expandable.replayed.peak_reserved);
  CHECK(static_cast<std::uint64_t>(stats.allocated_bytes[stat_all].peak) == expandable.replayed.peak_allocated);
  CHECK(static_cast<std::uint64_t>(stats.num_device_alloc) == expandable.replayed.device_allocs);
}

namespace {

// A capture's pool that the default pool must not reuse: 512 B in the default
// pool on stream A; then, captured into a private pool on A, 128 KiB and
// 64 KiB (a new segment, although the default one had room), freed; then two
// default requests of 1 MiB on A: the first fits the default segment, the
// second fits only the private one, which it must not take, so the real run
// reserves a third segment. Then the pool's use ends and empty_cache returns
// its segment. The real run's figures are the ground truth.
struct CaptureRun {
  snapshot::Snapshot recorded;
  MemoryStats stats;
  MemoryStats before_release;
};

CaptureRun capture_run() {
  CaptureRun run;
  auto device = make_simulated_device(simulated_h200_options());
  CachingAllocator allocator(device);
  HistoryOptions options;
  options.stacks = StackCapture::none;
  HistoryRecorder recorder(allocator, options);
  const Stream a = device->create_stream();
  const PrivatePoolId pool{0, 7};
  void* small = allocator.allocate(512, a);
  allocator.begin_allocate_to_pool(pool, [a](Stream s) { return s == a; });
  void* captured = allocator.allocate(128 << 10, a);
  void* captured2 = allocator.allocate(64 << 10, a);
  allocator.end_allocate_to_pool(pool);
  allocator.deallocate(captured);
  allocator.deallocate(captured2);
  void* first = allocator.allocate(1 << 20, a);
  void* second = allocator.allocate(1 << 20, a);
  run.before_release = allocator.stats();
  allocator.release_pool(pool);
  allocator.empty_cache();
  run.stats = allocator.stats();
  run.recorded = recorder.take_snapshot();
  for (void* p : {small, first, second}) allocator.deallocate(p);
  return run;
}

}  // namespace

TEST_CASE("given a capture into a private pool, when replayed, then its requests are replayed in a pool of their own, "
          "whose segment no later default request takes, and the pool's release returns it") {
  const CaptureRun run = capture_run();
  // The real run: three segments of 2 MiB at once (default, private, default), the private one returned at the end.
  REQUIRE(run.before_release.segment[stat_all].current == 3);
  REQUIRE(run.stats.num_device_free == 1);
  const snapshot::Snapshot as_pickle =
      snapshot::decode_pytorch_pickle(snapshot::encode_pytorch_pickle(run.recorded));
  for (const snapshot::Snapshot* snap : {&run.recorded, &as_pickle}) {
    const std::string kind = snap == &as_pickle ? "as a PyTorch pickle" : "our own snapshot";
    INFO(kind);
    analyzer::SnapshotEvents source(*snap);
    const analyzer::ReplayResult r = analyzer::replay_allocator(source);
    CHECK(r.inferred_private_pools == 1);
    CHECK(r.private_pool_requests == 2);
    CHECK(static_cast<std::int64_t>(r.replayed.peak_reserved) == run.stats.reserved_bytes[stat_all].peak);
    CHECK(static_cast<std::int64_t>(r.replayed.peak_allocated) == run.stats.allocated_bytes[stat_all].peak);
    CHECK(static_cast<std::int64_t>(r.replayed.segments) == run.stats.segment[stat_all].current);
    CHECK(static_cast<std::int64_t>(r.replayed.device_allocs) == run.stats.num_device_alloc);
    CHECK(static_cast<std::int64_t>(r.replayed.device_frees) == run.stats.num_device_free);
    CHECK(static_cast<std::int64_t>(r.replayed.reserved_at_end) == run.stats.reserved_bytes[stat_all].current);
    CHECK(r.replayed.peak_reserved == r.recorded.peak_reserved);
  }
}

TEST_CASE("given a reservation on the capture's stream right after the capture, while its pool had room, when "
          "replayed, then that segment is the default pool's: the capture had ended") {
  // Default 1 MiB + 512 KiB on A (512 KiB left); 128 KiB captured (it fits
  // there, so the new segment is private), freed; then 1 MiB in the default
  // pool: it fits only the private segment, which it must not take.
  auto device = make_simulated_device(simulated_h200_options());
  CachingAllocator allocator(device);
  HistoryOptions options;
  options.stacks = StackCapture::none;
  HistoryRecorder recorder(allocator, options);
  const Stream a = device->create_stream();
  const PrivatePoolId pool{3, 0};
  void* one = allocator.allocate(1 << 20, a);
  void* half = allocator.allocate(512 << 10, a);
  allocator.begin_allocate_to_pool(pool, [a](Stream s) { return s == a; });
  allocator.deallocate(allocator.allocate(128 << 10, a));
  allocator.end_allocate_to_pool(pool);
  void* after = allocator.allocate(1 << 20, a);
  const MemoryStats stats = allocator.stats();
  REQUIRE(stats.segment[stat_all].current == 3);
  const snapshot::Snapshot snap = snapshot::decode_pytorch_pickle(snapshot::encode_pytorch_pickle(recorder.take_snapshot()));
  analyzer::SnapshotEvents source(snap);
  const analyzer::ReplayResult r = analyzer::replay_allocator(source);
  CHECK(r.inferred_private_pools == 1);
  CHECK(r.private_pool_requests == 1);
  CHECK(static_cast<std::int64_t>(r.replayed.segments) == stats.segment[stat_all].current);
  CHECK(static_cast<std::int64_t>(r.replayed.device_allocs) == stats.num_device_alloc);
  CHECK(static_cast<std::int64_t>(r.replayed.peak_reserved) == stats.reserved_bytes[stat_all].peak);
  for (void* p : {one, half, after}) allocator.deallocate(p);
}

TEST_CASE("given default requests only, each reservation made because nothing fitted, when replayed, then no private "
          "pool is inferred") {
  auto device = make_simulated_device(simulated_h200_options());
  CachingAllocator allocator(device);
  HistoryOptions options;
  options.stacks = StackCapture::none;
  HistoryRecorder recorder(allocator, options);
  const Stream a = device->create_stream();
  std::vector<void*> held;
  for (int i = 0; i < 5; ++i) held.push_back(allocator.allocate(1 << 20, a));
  allocator.deallocate(held[1]);
  held.push_back(allocator.allocate(1 << 20, a));  // reuses held[1]'s block
  held.push_back(allocator.allocate(1 << 20, Stream{}));  // another stream: a segment of its own
  const snapshot::Snapshot snap = recorder.take_snapshot();
  analyzer::SnapshotEvents source(snap);
  const analyzer::ReplayResult r = analyzer::replay_allocator(source);
  CHECK(r.inferred_private_pools == 0);
  CHECK(r.private_pool_requests == 0);
  CHECK(static_cast<std::int64_t>(r.replayed.device_allocs) == allocator.stats().num_device_alloc);
  for (std::size_t i = 0; i < held.size(); ++i)
    if (i != 1) allocator.deallocate(held[i]);
}

TEST_CASE("a PyTorch snapshot holds no device total: the replay says so, and a capacity above an H200's is taken") {
  // Given PyTorch's snapshot of a training run, which records no device total.
  analyzer::FileEvents source(kPytorch / "corpus" / "varlen_transformer.pickle");
  REQUIRE(std::all_of(source.head().devices.begin(), source.head().devices.end(),
                      [](const snapshot::DeviceInfo& d) { return d.total_bytes == 0; }));
  // When it is replayed, then the device total is unknown, not an H200's
  // presented as the run's, and a note names the size simulated.
  const analyzer::ReplayResult plain = analyzer::replay_allocator(source);
  CHECK_FALSE(plain.device_total_known);
  CHECK(std::any_of(plain.notes.begin(), plain.notes.end(),
                    [](const std::string& n) { return n.find("holds no device total") != std::string::npos; }));
  std::ostringstream json;
  analyzer::render(analyzer::replay_report(plain), analyzer::Format::json, json);
  const auto parsed = analyzer::testing::parse_json(json.str());
  CHECK(std::holds_alternative<std::nullptr_t>(parsed["device_total"].value));
  CHECK(parsed["simulated_device_total"].number() == static_cast<double>(plain.device_total));
  // And a capacity of a GPU larger than an H200 (192 GiB) is taken as given.
  analyzer::AllocatorReplayOptions options;
  options.capacity = 192ull << 30;
  analyzer::FileEvents again(kPytorch / "corpus" / "varlen_transformer.pickle");
  const analyzer::ReplayResult big = analyzer::replay_allocator(again, options);
  CHECK(big.device_total == (192ull << 30));
  CHECK(big.cap == (192ull << 30));
  // The note says what was used: the capacity given, not an H200's, and
  // asks for no --capacity it already has.
  const auto note_of = [](const analyzer::ReplayResult& r) {
    for (const std::string& n : r.notes)
      if (n.find("holds no device total") != std::string::npos) return n;
    return std::string();
  };
  CHECK(note_of(big).find(std::to_string(192ull << 30) + " bytes, the --capacity given") != std::string::npos);
  CHECK(note_of(big).find("H200's;") == std::string::npos);
  CHECK(note_of(big).find("give its size") == std::string::npos);
  options.capacity = 8ull << 30;
  analyzer::FileEvents capped_source(kPytorch / "corpus" / "varlen_transformer.pickle");
  const analyzer::ReplayResult capped = analyzer::replay_allocator(capped_source, options);
  CHECK(note_of(capped).find("an H200's, capped at the " + std::to_string(8ull << 30) + " bytes of --capacity") !=
        std::string::npos);
  // And a capacity of 0 is refused without claiming an upper bound the replay does not hold.
  options.capacity = 0;
  analyzer::FileEvents zero(kPytorch / "corpus" / "varlen_transformer.pickle");
  CHECK_THROWS_WITH(analyzer::replay_allocator(zero, options), "the capacity must be at least 1 byte");
  // Without a cap, the report's table says there is none, not that it is unknown.
  std::ostringstream table;
  analyzer::render(analyzer::replay_report(plain), analyzer::Format::table, table);
  const std::size_t cap_line = table.str().find("  replay's cap ");
  REQUIRE(cap_line != std::string::npos);
  const std::string line = table.str().substr(cap_line, table.str().find('\n', cap_line) - cap_line);
  CHECK(line.ends_with(" none"));
  CHECK(table.str().find("(null)") == std::string::npos);
}

namespace {

// A copy of `run` whose history was switched on late: its first `cut`
// events never recorded, nothing in the file saying so (no ring overflow,
// no flag), exactly as `_record_memory_history` called mid-run leaves it.
snapshot::Snapshot switched_on_late(snapshot::Snapshot run, std::size_t cut) {
  run.events.erase(run.events.begin(), run.events.begin() + static_cast<std::ptrdiff_t>(cut));
  run.dropped_events = 0;
  run.settings.erase("trace_may_begin_mid_run");
  return run;
}

}  // namespace

TEST_CASE("given long real runs whose history was switched on late, when replayed, then the memory held before the "
          "first event is kept and the dump's figures equal PyTorch's") {
  const std::filesystem::path long_runs = kPytorch / "long";
  for (const char* name : {"long_train", "long_rank1"}) {
    const Json stats =
        analyzer::testing::parse_json(testing::zstd_text(long_runs / (std::string(name) + ".stats.json.zst")));
    const Json dump = stats["dump"];
    const snapshot::Snapshot whole = analyzer::load(long_runs / (std::string(name) + ".pickle.zst"));
    REQUIRE(whole.events.size() > 150000);
    for (const std::size_t cut : {std::size_t{200}, std::size_t{777}, whole.events.size() / 3, whole.events.size() - 5000}) {
      INFO(std::string(name), " cut at ", cut);
      const snapshot::Snapshot late = switched_on_late(whole, cut);
      analyzer::SnapshotEvents source(late);
      const analyzer::ReplayResult r = analyzer::replay_allocator(source);
      const analyzer::Analysis a = analyzer::analyze(source, {});
      REQUIRE(a.starts_mid_run);
      CHECK(r.starts_mid_run);
      CHECK(r.initial_blocks_not_rebuilt == 0);
      for (const auto* side : {&r.recorded, &r.replayed}) {
        CHECK(static_cast<std::int64_t>(side->allocated_at_end) == number(dump, "allocated_bytes.all.current"));
        CHECK(static_cast<std::int64_t>(side->reserved_at_end) == number(dump, "reserved_bytes.all.current"));
        CHECK(static_cast<std::int64_t>(side->segments) == number(dump, "segment.all.current"));
      }
      // The window's peaks are the summary's, and PyTorch's run peaked no lower.
      CHECK(r.recorded.peak_allocated == a.peak_allocated.bytes);
      CHECK(r.recorded.peak_reserved == a.peak_reserved.bytes);
      CHECK(r.replayed.peak_reserved == r.recorded.peak_reserved);
      CHECK(static_cast<std::int64_t>(r.recorded.peak_reserved) <= number(dump, "reserved_bytes.all.peak"));
    }
  }
}

TEST_CASE("given many frees waiting for other streams, when replayed, then each completes where the recording "
          "completed it, and frees completing in order share one queue") {
  // Given 2000 blocks freed while in use by another stream (record_stream),
  // each free waiting while the next allocations go on, completed in the
  // order requested or shuffled
  for (const bool shuffled : {false, true}) {
    CAPTURE(shuffled);
    constexpr std::uint64_t kCount = 2000;
    const snapshot::Snapshot snap = analyzer::testing::waiting_frees_trace(kCount, shuffled);
    analyzer::SnapshotEvents source(snap);
    // When replayed
    const analyzer::ReplayResult r = analyzer::replay_allocator(source);
    // Then every wait is seen, the queues are few, and the replay's figures are the recording's
    CHECK(r.deferred_frees == kCount);
    CHECK(r.deferred_queues == (shuffled ? kCount / 2 : 1));
    CHECK(r.replayed.peak_allocated == r.recorded.peak_allocated);
    CHECK(r.replayed.allocated_at_end == r.recorded.allocated_at_end);
    CHECK(r.replayed.peak_reserved == r.recorded.peak_reserved);
    CHECK(r.replayed.reserved_at_end == r.recorded.reserved_at_end);
  }
}

TEST_CASE("the recorded cap given as a fraction, as bytes or as the recorded fraction gives the same replay, the recorded one") {
  // given a real run under a memory fraction that its pickle does not record
  const snapshot::Snapshot snap = analyzer::load(std::filesystem::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "pytorch" /
                                                 "corpus" / "roundup_gc.pickle");
  analyzer::SnapshotEvents source(snap);
  const double fraction = 0.010729558457887924;  // 1.50 GiB of an H200's 139.8 GiB, as the run had
  // when the replay is told its cap as a fraction, as bytes, and as the recorded run's fraction alone
  analyzer::AllocatorReplayOptions by_fraction;
  by_fraction.fraction = fraction;
  analyzer::AllocatorReplayOptions by_bytes;
  by_bytes.capacity = 1610612736;
  analyzer::AllocatorReplayOptions by_recorded;
  by_recorded.recorded_fraction = fraction;
  const analyzer::ReplayResult a = analyzer::replay_allocator(source, by_fraction);
  const analyzer::ReplayResult b = analyzer::replay_allocator(source, by_bytes);
  const analyzer::ReplayResult c = analyzer::replay_allocator(source, by_recorded);
  // then each replays the recorded run: the same cap and figures, the recorded ones
  for (const analyzer::ReplayResult* r : {&a, &b, &c}) {
    CHECK(r->cap == 1610612736);
    CHECK(r->replayed.segments == r->recorded.segments);
    CHECK(r->replayed.device_allocs == r->recorded.device_allocs);
    CHECK(r->replayed.device_frees == r->recorded.device_frees);
    CHECK(r->replayed.reserved_at_end == r->recorded.reserved_at_end);
    CHECK(r->replayed.peak_reserved == r->recorded.peak_reserved);
  }
  CHECK(b.replayed.device_frees == a.replayed.device_frees);
  CHECK(c.replayed.segments == a.replayed.segments);
}
