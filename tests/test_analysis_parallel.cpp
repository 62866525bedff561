// The parallel analysis (AnalysisOptions::threads) gives the serial answer,
// figure for figure, wherever the trace is cut into ranges, and on real
// PyTorch runs the figures PyTorch's memory_stats() gave at the dump.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "../analyzer/testing/parsers.hpp"
#include "../analyzer/testing/trace_builder.hpp"
#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/load.hpp"
#include "cachealloc/analyzer/reports.hpp"
#include "cachealloc/snapshot/format.hpp"

using namespace cachealloc;
namespace fs = std::filesystem;

namespace {

const fs::path kSource(CACHEALLOC_SOURCE_DIR);

void same_totals(const analyzer::Totals& x, const analyzer::Totals& y, const char* what) {
  CAPTURE(what);
  CHECK(x.allocated == y.allocated);
  CHECK(x.requested == y.requested);
  CHECK(x.active == y.active);
  CHECK(x.reserved == y.reserved);
  CHECK(x.inactive_split == y.inactive_split);
  CHECK(x.segments == y.segments);
}

void same_cache(const analyzer::CacheFigures& x, const analyzer::CacheFigures& y, const char* what) {
  CAPTURE(what);
  CHECK(x.pending_free == y.pending_free);
  CHECK(x.cached_free == y.cached_free);
  CHECK(x.inactive_split == y.inactive_split);
  CHECK(x.releasable == y.releasable);
  CHECK(x.largest_free == y.largest_free);
  CHECK(x.rounding_waste == y.rounding_waste);
}

void same_peak(const analyzer::Peak& x, const analyzer::Peak& y, const char* what) {
  CAPTURE(what);
  CHECK(x.bytes == y.bytes);
  CHECK(x.event == y.event);
  CHECK(x.time_ns == y.time_ns);
  CHECK(x.phase == y.phase);
}

// Every figure of two analyses of the same events.
void same_analysis(const analyzer::Analysis& x, const analyzer::Analysis& y) {
  CHECK(x.device == y.device);
  CHECK(x.event_count == y.event_count);
  CHECK(x.time_origin_ns == y.time_origin_ns);
  CHECK(x.counts == y.counts);
  CHECK(x.blocks_from_before_ring == y.blocks_from_before_ring);
  CHECK(x.starts_mid_run == y.starts_mid_run);
  same_totals(x.totals_at_start, y.totals_at_start, "at start");
  same_totals(x.totals_at_end, y.totals_at_end, "at end");
  same_cache(x.cache_at_start, y.cache_at_start, "cache at start");
  same_cache(x.cache_at_end, y.cache_at_end, "cache at end");
  same_cache(x.cache_at_peak_reserved, y.cache_at_peak_reserved, "cache at the reserved peak");
  CHECK(x.segments_at_end == y.segments_at_end);
  same_peak(x.peak_allocated, y.peak_allocated, "peak allocated");
  same_peak(x.peak_reserved, y.peak_reserved, "peak reserved");
  same_peak(x.peak_active, y.peak_active, "peak active");
  same_peak(x.peak_requested, y.peak_requested, "peak requested");
  same_peak(x.peak_inactive_split, y.peak_inactive_split, "peak inactive_split");
  CHECK(x.peak_segments == y.peak_segments);
  REQUIRE(x.sites.size() == y.sites.size());
  for (std::size_t s = 0; s < x.sites.size(); ++s) {
    CAPTURE(s);
    const analyzer::SiteFigures& a = x.sites[s];
    const analyzer::SiteFigures& b = y.sites[s];
    CHECK(a.stack == b.stack);
    CHECK(a.allocs == b.allocs);
    CHECK(a.alloc_bytes == b.alloc_bytes);
    CHECK(a.requested_bytes == b.requested_bytes);
    CHECK(a.bytes_at_peak_allocated == b.bytes_at_peak_allocated);
    CHECK(a.blocks_at_peak_allocated == b.blocks_at_peak_allocated);
    CHECK(a.bytes_at_peak_reserved == b.bytes_at_peak_reserved);
    CHECK(a.blocks_at_peak_reserved == b.blocks_at_peak_reserved);
    CHECK(a.live_bytes_at_end == b.live_bytes_at_end);
    CHECK(a.live_blocks_at_end == b.live_blocks_at_end);
  }
  REQUIRE(x.ooms.size() == y.ooms.size());
  for (std::size_t o = 0; o < x.ooms.size(); ++o) {
    CHECK(x.ooms[o].event == y.ooms[o].event);
    CHECK(x.ooms[o].phase == y.ooms[o].phase);
    same_totals(x.ooms[o].totals, y.ooms[o].totals, "at the OOM");
    same_cache(x.ooms[o].cache, y.ooms[o].cache, "cache at the OOM");
    REQUIRE(x.ooms[o].top_sites.size() == y.ooms[o].top_sites.size());
    for (std::size_t s = 0; s < x.ooms[o].top_sites.size(); ++s) {
      CHECK(x.ooms[o].top_sites[s].stack == y.ooms[o].top_sites[s].stack);
      CHECK(x.ooms[o].top_sites[s].bytes == y.ooms[o].top_sites[s].bytes);
    }
  }
  REQUIRE(x.timeline.size() == y.timeline.size());
  for (std::size_t r = 0; r < x.timeline.size(); ++r) {
    CAPTURE(r);
    CHECK(x.timeline[r].first_event == y.timeline[r].first_event);
    CHECK(x.timeline[r].last_event == y.timeline[r].last_event);
    CHECK(x.timeline[r].time_ns == y.timeline[r].time_ns);
    CHECK(x.timeline[r].kind == y.timeline[r].kind);
    same_totals(x.timeline[r].at_end, y.timeline[r].at_end, "row end");
    same_totals(x.timeline[r].max, y.timeline[r].max, "row max");
    REQUIRE(x.timeline[r].cache.has_value() == y.timeline[r].cache.has_value());
    if (x.timeline[r].cache) same_cache(*x.timeline[r].cache, *y.timeline[r].cache, "row cache");
  }
  CHECK(x.anomalies.total() == y.anomalies.total());
  CHECK(x.layout_check.checked == y.layout_check.checked);
  CHECK(x.layout_check.differences == y.layout_check.differences);
}

analyzer::AnalysisOptions with_rows(std::size_t buckets, unsigned threads) {
  analyzer::AnalysisOptions options;
  options.timeline = analyzer::AnalysisOptions::Timeline::buckets;
  options.buckets = buckets;
  options.sample_fragmentation = true;
  options.threads = threads;
  return options;
}

analyzer::testing::Json read_json(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return analyzer::testing::parse_json(text.str());
}

}  // namespace

TEST_CASE("the parallel analysis of a random trace equals the serial one wherever the ranges fall") {
  // Given random traces with pending frees, releases, annotations and an OOM
  for (const std::uint64_t seed : {1u, 2u, 3u}) {
    CAPTURE(seed);
    const snapshot::Snapshot snap = analyzer::testing::random_trace(seed, 6000, 8, 7);
    analyzer::SnapshotEvents serial_source(snap, 997);
    const analyzer::Analysis serial = analyzer::analyze(serial_source, with_rows(13, 1));
    REQUIRE(serial.anomalies.total() == 0);
    REQUIRE(serial.ooms.size() == 1);
    CHECK(serial.threads == 1);
    // When the same events are cut into blocks of several sizes and read by
    // 2 to 9 threads
    for (const std::size_t block : {1u, 7u, 250u, 997u}) {
      for (const unsigned threads : {2u, 3u, 4u, 9u}) {
        CAPTURE(block);
        CAPTURE(threads);
        analyzer::SnapshotEvents source(snap, block);
        const analyzer::Analysis parallel = analyzer::analyze(source, with_rows(13, threads));
        // Then the parallel pass ran, and every figure is the serial one
        CHECK(parallel.threads == std::min<std::size_t>(threads, source.block_count()));
        same_analysis(parallel, serial);
      }
    }
  }
}

TEST_CASE("timeline rows never end between a free and its completion, in one pass or in ranges") {
  // Given a random trace in which most frees are a free_requested and its
  // free_completed side by side (a free no stream waited on)
  const snapshot::Snapshot snap = analyzer::testing::random_trace(4, 3000, 8, 7);
  const std::size_t n = snap.events.size();
  auto pair_at = [&](std::size_t i) {
    return i + 1 < n && snap.events[i].kind == snapshot::EventKind::free_requested &&
           snap.events[i + 1].kind == snapshot::EventKind::free_completed &&
           snap.events[i + 1].address == snap.events[i].address && snap.events[i + 1].device == snap.events[i].device;
  };
  std::size_t pairs = 0;
  for (std::size_t i = 0; i < n; ++i) pairs += pair_at(i);
  REQUIRE(pairs > 500);
  // and the state after every event, one row per event
  analyzer::AnalysisOptions every;
  every.timeline = analyzer::AnalysisOptions::Timeline::per_event;
  const analyzer::Analysis per_event = analyzer::analyze(snap, every);
  REQUIRE(per_event.timeline.size() == n + 1);
  // When it is cut into rows of many sizes, down to one event a row
  for (const std::size_t buckets : {std::size_t{13}, n / 7, n / 3, n / 2 + 1, n - 1, n}) {
    CAPTURE(buckets);
    const analyzer::Analysis serial = analyzer::analyze(snap, with_rows(buckets, 1));
    // Then the rows cover every event once, in order, and none ends on a
    // free whose completion comes next
    REQUIRE(serial.timeline.size() >= 2);
    std::size_t next = 0;
    for (std::size_t r = 1; r < serial.timeline.size(); ++r) {
      const analyzer::TimelineRow& row = serial.timeline[r];
      CAPTURE(r);
      REQUIRE(row.first_event == next);
      REQUIRE(row.last_event >= row.first_event);
      CHECK_FALSE(pair_at(row.last_event));
      // and each row's figures are the states of its own events
      analyzer::Totals max;
      for (std::size_t i = row.first_event; i <= row.last_event; ++i) {
        const analyzer::Totals& t = per_event.timeline[i + 1].at_end;
        max.allocated = std::max(max.allocated, t.allocated);
        max.reserved = std::max(max.reserved, t.reserved);
        max.active = std::max(max.active, t.active);
        max.requested = std::max(max.requested, t.requested);
      }
      same_totals(row.at_end, per_event.timeline[row.last_event + 1].at_end, "row end");
      CHECK(row.max.allocated == max.allocated);
      CHECK(row.max.reserved == max.reserved);
      CHECK(row.max.active == max.active);
      CHECK(row.max.requested == max.requested);
      next = row.last_event + 1;
    }
    CHECK(next == n);
    // and ranges of the events, cut anywhere, give the same rows
    for (const std::size_t block : {1u, 2u, 7u, 500u}) {
      for (const unsigned threads : {2u, 3u, 8u}) {
        CAPTURE(block);
        CAPTURE(threads);
        analyzer::SnapshotEvents source(snap, block);
        same_analysis(analyzer::analyze(source, with_rows(buckets, threads)), serial);
      }
    }
  }
}

TEST_CASE("a trace that begins mid-run (a derived start) analysed in parallel gives the serial answer") {
  // Given a random trace whose first 1,500 events were lost
  snapshot::Snapshot snap = analyzer::testing::random_trace(5, 6000, 8, 7);
  snap.events.erase(snap.events.begin(), snap.events.begin() + 1500);
  snap.dropped_events = 1500;
  const analyzer::Analysis serial = analyzer::analyze(snap, with_rows(9, 1));
  REQUIRE(serial.starts_mid_run);
  REQUIRE(serial.anomalies.total() == 0);
  for (const std::size_t block : {3u, 400u}) {
    CAPTURE(block);
    // When it is analysed on 5 threads
    analyzer::SnapshotEvents source(snap, block);
    const analyzer::Analysis parallel = analyzer::analyze(source, with_rows(9, 5));
    // Then from the same start every figure is the serial one
    CHECK(parallel.threads == 5);
    same_analysis(parallel, serial);
  }
}

TEST_CASE("a peak of reserved bytes at a range's last event takes its largest free block in the next range") {
  // Given a trace whose reserved peak is a new segment, with the alloc that
  // made it the next event and the next request after that
  analyzer::testing::TraceBuilder builder;
  const snapshot::StackId stack = builder.stack({"f"});
  builder.segment(0x100000, 20 << 20);
  builder.alloc(0x100000, 1 << 20, 1 << 20, stack);
  builder.segment(0x4000000, 20 << 20);
  builder.alloc(0x4000000, 2 << 20, 2 << 20, stack);
  builder.alloc(0x4200000, 4 << 20, 4 << 20, stack);
  builder.free(0x4200000);
  const snapshot::Snapshot snap = builder.build();
  const analyzer::Analysis serial = analyzer::analyze(snap, with_rows(3, 1));
  REQUIRE(serial.peak_reserved.event < snap.events.size());
  REQUIRE(snap.events[serial.peak_reserved.event].kind == snapshot::EventKind::segment_alloc);
  // When the ranges end at each event in turn
  for (std::size_t block = 1; block <= 5; ++block) {
    CAPTURE(block);
    analyzer::SnapshotEvents source(snap, block);
    const analyzer::Analysis parallel = analyzer::analyze(source, with_rows(3, 8));
    // Then the largest free block there is the one after the next request
    CHECK(parallel.threads > 1);
    CHECK(parallel.cache_at_peak_reserved.largest_free == serial.cache_at_peak_reserved.largest_free);
    same_analysis(parallel, serial);
  }
}

TEST_CASE("a streamed file of several blocks analysed in parallel gives the serial answer and the same reports") {
  // Given a trace of five 64 Ki blocks written to a file
  const snapshot::Snapshot snap = analyzer::testing::random_trace(7, 300000, 32, 40);
  const fs::path path = fs::temp_directory_path() / ("cachealloc-parallel-test-" + std::to_string(::getpid()) + ".bin");
  snapshot::write_snapshot(snap, path);
  analyzer::FileEvents serial_source(path);
  REQUIRE(serial_source.streaming());
  REQUIRE(serial_source.block_count() >= 4);
  const analyzer::Analysis serial = analyzer::analyze(serial_source, with_rows(20, 1));
  // When it is analysed on 4 threads, each reading its own blocks
  analyzer::FileEvents source(path);
  const analyzer::Analysis parallel = analyzer::analyze(source, with_rows(20, 4));
  // Then the figures are the serial ones
  CHECK(parallel.threads == 4);
  same_analysis(parallel, serial);
  // And every report that analyses the whole trace prints the same
  using Builder = analyzer::Document (*)(analyzer::EventSource&, const analyzer::ReportOptions&);
  for (const Builder build : {Builder{analyzer::summary_report}, Builder{analyzer::peak_report},
                              Builder{analyzer::top_report}, Builder{analyzer::fragmentation_report},
                              Builder{analyzer::oom_report}, Builder{analyzer::leaks_report}}) {
    analyzer::ReportOptions one;
    analyzer::ReportOptions four;
    four.threads = 4;
    analyzer::FileEvents a(path);
    analyzer::FileEvents b(path);
    std::ostringstream serial_text;
    std::ostringstream parallel_text;
    analyzer::render(build(a, one), analyzer::Format::json, serial_text);
    analyzer::render(build(b, four), analyzer::Format::json, parallel_text);
    CHECK(serial_text.str() == parallel_text.str());
  }
  fs::remove(path);
}

TEST_CASE("traces the parallel pass does not cover are analysed serially, with the same answer") {
  // Given a trace with an event the state cannot explain (a free of an
  // address never allocated)
  analyzer::testing::TraceBuilder builder;
  const snapshot::StackId stack = builder.stack({"f"});
  builder.segment(0x100000, 20 << 20);
  for (int i = 0; i < 50; ++i) {
    builder.alloc(0x100000, 1 << 20, 1 << 20, stack);
    builder.free(0x100000);
  }
  snapshot::Snapshot broken = builder.build();
  snapshot::Event stray = broken.events.back();
  stray.kind = snapshot::EventKind::free_completed;
  stray.address = 0x900000;
  broken.events.insert(broken.events.begin() + 40, stray);
  const analyzer::Analysis serial = analyzer::analyze(broken, with_rows(5, 1));
  REQUIRE(serial.anomalies.free_of_unknown_block == 1);
  analyzer::SnapshotEvents source(broken, 10);
  const analyzer::Analysis parallel = analyzer::analyze(source, with_rows(5, 4));
  // Then it ran on one thread, and gives the serial figures
  CHECK(parallel.threads == 1);
  same_analysis(parallel, serial);

  // And so do a window that is not the whole trace and one row per event
  const snapshot::Snapshot snap = analyzer::testing::random_trace(4, 2000);
  analyzer::AnalysisOptions window = with_rows(5, 4);
  window.window = {100, 1500};
  analyzer::SnapshotEvents cut(snap, 100);
  CHECK(analyzer::analyze(cut, window).threads == 1);
  analyzer::AnalysisOptions per_event;
  per_event.timeline = analyzer::AnalysisOptions::Timeline::per_event;
  per_event.threads = 4;
  CHECK(analyzer::analyze(cut, per_event).threads == 1);
}

TEST_CASE("on real PyTorch runs the parallel analysis gives PyTorch's figures at the dump") {
  const fs::path corpus = kSource / "testdata" / "pytorch" / "corpus";
  std::size_t parallel_runs = 0;
  for (const char* name : {"cuda_graph", "empty_cache_mid", "oom_retry", "ring_overflow", "roundup_gc", "roundup_list",
                           "stacks_all", "stacks_python", "streams", "varlen_transformer", "expandable"}) {
    CAPTURE(name);
    // Given PyTorch's snapshot and its own figures at the dump
    const snapshot::Snapshot snap = analyzer::load(corpus / (std::string(name) + ".pickle"));
    const analyzer::testing::Json truth = read_json(corpus / (std::string(name) + ".stats.json"))["dump"];
    // When it is analysed in ranges of 61 events on 6 threads
    analyzer::SnapshotEvents source(snap, 61);
    const analyzer::Analysis a = analyzer::analyze(source, with_rows(10, 6));
    parallel_runs += a.threads > 1;
    // Then the figures at the dump are PyTorch's, and the serial ones
    auto figure = [&](const char* key) { return static_cast<std::uint64_t>(truth[key].number()); };
    CHECK(a.totals_at_end.allocated == figure("allocated_bytes.all.current"));
    CHECK(a.totals_at_end.reserved == figure("reserved_bytes.all.current"));
    CHECK(a.totals_at_end.active == figure("active_bytes.all.current"));
    CHECK(a.totals_at_end.segments == figure("segment.all.current"));
    if (!a.truncated()) {
      CHECK(a.totals_at_end.requested == figure("requested_bytes.all.current"));
      CHECK(a.device_allocs() == figure("num_device_alloc"));
      CHECK(a.device_frees() == figure("num_device_free"));
    }
    same_analysis(a, analyzer::analyze(snap, with_rows(10, 1)));
  }
  // (expandable segments run serially; the rest are cut into ranges)
  CHECK(parallel_runs >= 8);
}

namespace {

snapshot::Event event_of(snapshot::EventKind kind, std::uint64_t address, std::uint64_t size, std::uint64_t aux = 0,
                         std::uint32_t stack = 0) {
  static std::uint64_t time = 1000;
  snapshot::Event e;
  e.kind = kind;
  e.address = address;
  e.size = size;
  e.aux = aux;
  e.stack = snapshot::StackId{stack};
  e.time_ns = time += 10;
  return e;
}

snapshot::Snapshot bare_snapshot() {
  snapshot::Snapshot s;
  s.devices.push_back(snapshot::DeviceInfo{});
  return s;
}

}  // namespace

TEST_CASE("damaged traces the ranges cannot start from are analysed serially, with the serial figures") {
  using snapshot::EventKind;
  // Given three in-memory traces a file could not hold or a replay only
  // follows by its own history (found in review):
  // overlapping segments, the higher made first, and an alloc in both
  snapshot::Snapshot overlap = bare_snapshot();
  overlap.events = {event_of(EventKind::segment_alloc, 0x500, 0x2000), event_of(EventKind::segment_alloc, 0x0, 0x1000),
                    event_of(EventKind::alloc, 0x700, 0x100, 0x100), event_of(EventKind::empty_cache, 0, 0)};
  // a stack id past the stack table, in the first range only
  snapshot::Snapshot far_stack = bare_snapshot();
  far_stack.events = {event_of(EventKind::segment_alloc, 0x0, 0x1000),
                      event_of(EventKind::alloc, 0x0, 0x100, 0x100, 5),
                      event_of(EventKind::free_completed, 0x0, 0x100, 0x100, 5),
                      event_of(EventKind::empty_cache, 0, 0),
                      event_of(EventKind::alloc, 0x0, 0x100, 0x100, 0),
                      event_of(EventKind::empty_cache, 0, 0)};
  // a ring start whose blocks do not cover their segment
  snapshot::Snapshot untiled = bare_snapshot();
  untiled.dropped_events = 5;
  snapshot::Segment segment{0, 0, 0x0, 0x1000, true, false, {}, {}};
  segment.blocks.push_back(snapshot::Block{0x0, 0x100, 0x100, snapshot::BlockState::active_allocated, {}});
  untiled.ring_start.push_back(snapshot::RingStart{0, {segment}, 0, 0});
  untiled.segments = {segment};
  untiled.events = {event_of(EventKind::empty_cache, 0, 0), event_of(EventKind::empty_cache, 0, 0),
                    event_of(EventKind::empty_cache, 0, 0), event_of(EventKind::empty_cache, 0, 0)};
  // (the far stack is within what the ranges cover: its site is sized as
  // the serial pass sizes it)
  for (const auto& [name, snap, block, threads] :
       {std::tuple{std::string("overlapping segments"), &overlap, std::size_t{2}, 1u},
        std::tuple{std::string("a stack past the table"), &far_stack, std::size_t{3}, 2u},
        std::tuple{std::string("an untiled ring start"), &untiled, std::size_t{2}, 1u}}) {
    CAPTURE(name);
    // When each is analysed on one thread and on two
    analyzer::SnapshotEvents one(*snap, block);
    analyzer::SnapshotEvents two(*snap, block);
    const analyzer::Analysis serial = analyzer::analyze(one, with_rows(3, 1));
    const analyzer::Analysis parallel = analyzer::analyze(two, with_rows(3, 2));
    // Then the ranges gave way where they must, and both give the same figures
    CHECK(parallel.threads == threads);
    same_analysis(parallel, serial);
  }
}

TEST_CASE("a file that cannot be opened again, and a progress callback that throws, leave the parallel pass cleanly") {
  // Given a streamed file of several blocks, opened, then removed
  const snapshot::Snapshot snap = analyzer::testing::random_trace(8, 200000, 16, 5);
  const fs::path path = fs::temp_directory_path() / ("cachealloc-parallel-gone-" + std::to_string(::getpid()) + ".bin");
  snapshot::write_snapshot(snap, path);
  analyzer::FileEvents reference(path);
  const analyzer::Analysis serial = analyzer::analyze(reference, with_rows(6, 1));
  analyzer::FileEvents source(path);
  REQUIRE(source.block_count() >= 3);
  fs::remove(path);
  // When it is analysed on 4 threads, each reading it through the open file
  const analyzer::Analysis parallel = analyzer::analyze(source, with_rows(6, 4));
  // Then the ranges ran, and the answer is the serial one
  CHECK(parallel.threads == 4);
  same_analysis(parallel, serial);
  // And an exception from the progress callback reaches the caller once
  // the threads are done, instead of ending the process
  analyzer::SnapshotEvents events(snap, 5000);
  analyzer::AnalysisOptions options = with_rows(6, 4);
  int calls = 0;
  options.progress = [&](std::size_t, std::size_t) {
    if (++calls == 1) throw std::runtime_error("stop");
  };
  CHECK_THROWS_WITH_AS(analyzer::analyze(events, options), "stop", std::runtime_error);
}
