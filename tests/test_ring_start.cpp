// The layout at the ring's start (snapshot/ring_start.hpp): the writer
// stores the one derived from the events, it is the state the allocator
// really had there, and the analyzer uses it without a backward pass, but
// only as far as the events confirm it.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "../analyzer/testing/trace_builder.hpp"
#include "allocator_support.hpp"
#include "counting_events.hpp"
#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/reports.hpp"
#include "cachealloc/cachealloc.h"
#include "cachealloc/history.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/ring_start.hpp"

using namespace cachealloc;
namespace fs = std::filesystem;
using test_support::KiB;
using test_support::MiB;

namespace {

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("cachealloc-ring-start-" + std::to_string(::getpid()) + "-" + name);
}

// A backward pass reads every block once more.
using test_support::CountingEvents;

// A random trace of several blocks whose first 1000 events were lost.
snapshot::Snapshot overflowed_trace() {
  snapshot::Snapshot trace = analyzer::testing::random_trace(4, 200000, 3, 3);
  trace.events.erase(trace.events.begin(), trace.events.begin() + 1000);
  trace.dropped_events = 1000;
  return trace;
}

std::string render(const analyzer::Document& document) {
  std::ostringstream out;
  analyzer::render(document, analyzer::Format::json, out);
  return out.str();
}

}  // namespace

TEST_CASE("the ring start of an overflowed recording is the layout the allocator had there") {
  // Given the same workload recorded twice, once whole and once in a ring of
  // 100 events, on a simulated device
  auto record = [](std::size_t max_entries) {
    auto device = test_support::simulated();
    CachingAllocator allocator(device);
    HistoryOptions options;
    options.stacks = StackCapture::none;
    options.max_entries = max_entries;
    HistoryRecorder recorder(allocator, options);
    std::vector<void*> live;
    for (int i = 0; i < 300; ++i) {
      if (i % 3 == 2) {
        allocator.deallocate(live[live.size() / 2]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(live.size() / 2));
      } else {
        live.push_back(allocator.allocate(static_cast<std::size_t>(1 + i % 7) * 300 * KiB + i));
      }
    }
    return recorder.take_snapshot();
  };
  const snapshot::Snapshot all = record(1'000'000);
  snapshot::Snapshot ring = record(100);
  REQUIRE(all.dropped_events == 0);
  REQUIRE(ring.dropped_events == all.events.size() - 100);
  REQUIRE(ring.ring_start.empty());  // the recorder leaves it to the writer

  // When the ring is written and read back
  const fs::path path = temp_path("recorded.bin");
  snapshot::write_snapshot(ring, path);
  const snapshot::Snapshot read = snapshot::read_snapshot(path);
  fs::remove(path);

  // Then it holds one start, for the device, equal to the derived one
  REQUIRE(read.ring_start.size() == 1);
  const snapshot::RingStart& stored = read.ring_start[0];
  CHECK(stored == snapshot::derive_ring_start(ring.segments, stored.device, ring.events));
  CHECK(stored == analyzer::derive_initial_layout(ring, stored.device));
  CHECK(stored.unplaced_blocks == 0);
  // And it is the layout the whole recording had just before the ring's first event
  analyzer::Replay whole({}, stored.device, all.stacks.size());
  for (std::size_t i = 0; i < ring.dropped_events; ++i) whole.apply(all.events[i]);
  std::size_t differences = 0;
  for (const std::string& line : analyzer::compare_layouts(stored.segments, whole.layout(), 5, differences))
    MESSAGE(line);
  CHECK(differences == 0);
  CHECK_FALSE(stored.segments.empty());
}

TEST_CASE("an analysis of a file with a stored ring start reads each block once") {
  // Given an overflowed trace written as a file, which stores its ring start
  const snapshot::Snapshot trace = overflowed_trace();
  const fs::path path = temp_path("once.bin");
  snapshot::write_snapshot(trace, path);
  analyzer::FileEvents file(path);
  REQUIRE(file.streaming());
  REQUIRE(!file.head().ring_start.empty());
  // When it is analyzed to the end
  CountingEvents counted(file);
  const analyzer::Analysis a = analyzer::analyze(counted, {});
  // Then no backward pass ran, and the answer is the derived start's
  CHECK(counted.reads == counted.block_count());
  CHECK(a.blocks_from_before_ring == analyzer::derive_initial_layout(trace, a.device).blocks_from_before_ring);
  CHECK(a.anomalies.total() == 0);
  CHECK(a.layout_check.differences == 0);
  // And the same file without a stored start costs a backward pass more
  analyzer::SnapshotEvents in_memory(trace);
  CountingEvents derived(in_memory);
  (void)analyzer::analyze(derived, {});
  CHECK(derived.reads == 2 * derived.block_count());
  fs::remove(path);
}

TEST_CASE("a stored ring start that the events contradict is replaced by the derived one") {
  // Given an overflowed trace written with a wrong ring start: the empty
  // allocator, or the real start with one segment left out
  const snapshot::Snapshot trace = overflowed_trace();
  const snapshot::RingStart real = analyzer::derive_initial_layout(trace, 0);
  REQUIRE(real.segments.size() >= 2);
  snapshot::RingStart missing_segment = real;
  missing_segment.segments.erase(missing_segment.segments.begin());
  for (const snapshot::RingStart& wrong : {snapshot::RingStart{0, {}, 0, 0}, missing_segment}) {
    snapshot::Snapshot lying = trace;
    lying.ring_start = {wrong};
    const fs::path path = temp_path("wrong.bin");
    snapshot::write_snapshot(lying, path);
    analyzer::FileEvents file(path);
    REQUIRE(file.head().ring_start == std::vector<snapshot::RingStart>{wrong});
    analyzer::SnapshotEvents in_memory(trace);  // no stored start: derived
    analyzer::ReportOptions window;
    window.window = {70000, 140000};
    // When reports read the file, over the whole trace and over a window
    // Then they say what the derived start makes them say
    for (const analyzer::ReportOptions& options : {analyzer::ReportOptions{}, window}) {
      CHECK(render(analyzer::summary_report(file, options)) == render(analyzer::summary_report(in_memory, options)));
      CHECK(render(analyzer::peak_report(file, options)) == render(analyzer::peak_report(in_memory, options)));
      CHECK(render(analyzer::segments_report(file, options)) ==
            render(analyzer::segments_report(in_memory, options)));
    }
    fs::remove(path);
  }
}

TEST_CASE("at_end sees the state once, even when the stored start proves wrong") {
  // Given a file whose stored ring start is wrong
  snapshot::Snapshot lying = overflowed_trace();
  lying.ring_start = {snapshot::RingStart{0, {}, 0, 0}};
  const fs::path path = temp_path("at-end.bin");
  snapshot::write_snapshot(lying, path);
  analyzer::FileEvents file(path);
  // When an analysis with an at_end callback reads it
  analyzer::AnalysisOptions options;
  std::size_t calls = 0;
  analyzer::Totals seen;
  options.at_end = [&](const analyzer::Replay& replay) {
    ++calls;
    seen = replay.totals();
  };
  const analyzer::Analysis a = analyzer::analyze(file, options);
  // Then the callback ran once, with the final state of the derived start
  CHECK(calls == 1);
  CHECK(seen == a.totals_at_end);
  CHECK(a.layout_check.differences == 0);
  fs::remove(path);
}

TEST_CASE("a segment_unmap of 0 bytes before the ring's end maps nothing and joins nothing") {
  // Given a trace that unmaps 0 bytes twice at one address, and again just
  // below an expandable range it unmapped (a mutant of a real expandable run:
  // PyTorch never writes these)
  auto event = [](std::uint64_t address, std::uint64_t size) {
    snapshot::Event e;
    e.kind = snapshot::EventKind::segment_unmap;
    e.address = address;
    e.size = size;
    e.aux = snapshot::segment_flag_expandable;
    return e;
  };
  const std::vector<snapshot::Event> events = {event(100 * MiB, 0), event(100 * MiB, 0), event(98 * MiB, 2 * MiB),
                                               event(98 * MiB, 0)};
  // When the layout at the ring's start is derived (before: reading past a
  // map's end when the range joined itself)
  const snapshot::RingStart start = snapshot::derive_ring_start({}, 0, events);
  // Then it holds the 2 MiB range that was unmapped, and one range at the
  // 0-byte address, whatever its size
  std::uint64_t mapped = 0;
  for (const snapshot::Segment& s : start.segments) mapped += s.total_size;
  CHECK(mapped == 2 * MiB);
}

namespace {

// A run whose ring lost its first three events (a segment, a split and an alloc) while
// three annotations older than its first memory event were kept, as PyTorch
// keeps annotations in a ring of their own: events #0-#2 are annotations,
// #3 (a split) is the ring's first memory event.
snapshot::Snapshot annotations_before_the_ring() {
  constexpr std::uint64_t kBase = 0x7f0000000000;
  analyzer::testing::TraceBuilder trace;
  trace.segment(kBase, 2 * MiB).alloc(kBase, MiB, MiB);
  trace.begin("step0").end("step0").begin("step1");
  trace.alloc(kBase + MiB, 512 * KiB, 512 * KiB).free(kBase).end("step1");
  return trace.drop_first(3).build();
}

}  // namespace

TEST_CASE("a trace begun mid-run that opens with annotations older than its first memory event: the figures start "
          "at that event, a window before it is refused, and a listing of the events keeps it") {
  const snapshot::Snapshot trace = annotations_before_the_ring();
  REQUIRE(trace.events.size() > 4);
  for (std::size_t i = 0; i < 3; ++i) REQUIRE(trace.events[i].kind == (i == 1 ? snapshot::EventKind::annotation_end : snapshot::EventKind::annotation_begin));
  REQUIRE(trace.events[3].kind == snapshot::EventKind::split);
  analyzer::SnapshotEvents source(trace);
  CHECK(analyzer::first_memory_event(source, 0) == 3);

  // The whole trace: the window starts at #3, and a peak at the start is at #3's time, in step1.
  analyzer::AnalysisOptions options;
  options.timeline = analyzer::AnalysisOptions::Timeline::per_event;
  const analyzer::Analysis a = analyzer::analyze(trace, options);
  CHECK(a.starts_mid_run);
  CHECK(a.ring_begins_at == 3);
  CHECK(a.ring_begins_time_ns == trace.events[3].time_ns);
  CHECK(a.window_cut_to_ring);
  CHECK(a.window.begin == 3);
  CHECK(a.window.end == trace.events.size());
  CHECK(a.peak_reserved.event == analyzer::kNoEvent);
  CHECK(a.peak_reserved.bytes == 2 * MiB);
  CHECK(a.peak_reserved.time_ns == trace.events[3].time_ns);
  REQUIRE(a.peak_reserved.phase.size() == 1);
  CHECK(trace.strings[a.peak_reserved.phase[0].value] == "step1");
  REQUIRE_FALSE(a.timeline.empty());
  CHECK(a.timeline.front().time_ns == trace.events[3].time_ns);  // the start row: the ring's start
  for (std::size_t k = 1; k < a.timeline.size(); ++k) CHECK(a.timeline[k].first_event >= 3);
  // Annotations counted are those from #3 on.
  CHECK(a.counts[static_cast<std::size_t>(snapshot::EventKind::annotation_begin)] == 0);
  CHECK(a.counts[static_cast<std::size_t>(snapshot::EventKind::annotation_end)] == 1);

  // A window that asks for earlier events starts at #3; one inside the annotations is refused.
  analyzer::AnalysisOptions from_one;
  from_one.window = analyzer::EventWindow{1, 6};
  const analyzer::Analysis cut = analyzer::analyze(trace, from_one);
  CHECK(cut.window.begin == 3);
  CHECK(cut.window.end == 6);
  analyzer::AnalysisOptions before;
  before.window = analyzer::EventWindow{0, 3};
  CHECK_THROWS_AS(analyzer::analyze(trace, before), InvalidArgument);
  analyzer::ReportOptions at_two;
  at_two.window = analyzer::EventWindow{0, 3};
  CHECK_THROWS_AS(analyzer::segments_report(trace, at_two), InvalidArgument);
  analyzer::FlameOptions flame_at_two;
  flame_at_two.at = analyzer::FlameOptions::At::event;
  flame_at_two.event = 2;
  CHECK_THROWS_AS(analyzer::flame_graph(source, analyzer::ReportOptions{}, flame_at_two), InvalidArgument);
  flame_at_two.event = 3;
  CHECK(analyzer::flame_graph(source, analyzer::ReportOptions{}, flame_at_two).event == 3);
  // The events report lists them.
  const std::string listed = render(analyzer::events_report(trace, at_two));
  CHECK(listed.find("memory is recorded from event #3") != std::string::npos);
  CHECK(listed.find("\"ring_begins_at\"") == std::string::npos);

  // The summary names the event, in a field and a note.
  const std::string summary = render(analyzer::summary_report(trace, analyzer::ReportOptions{}));
  CHECK(summary.find("\"ring_begins_at\":3") != std::string::npos);
  CHECK(summary.find("memory is recorded from event #3") != std::string::npos);
  CHECK(summary.find("limited to events") == std::string::npos);  // the cut is not the user's window

  // Perfetto: the counters from #3's time, the annotation slices from the first one.
  std::ostringstream perfetto;
  analyzer::write_perfetto_trace(source, analyzer::ReportOptions{}, 0, perfetto);
  const std::string events_json = perfetto.str();
  const std::string micros = [&] {
    const std::uint64_t ns = trace.events[3].time_ns - trace.events[0].time_ns;
    char text[40];
    std::snprintf(text, sizeof text, "%llu.%03llu", static_cast<unsigned long long>(ns / 1000),
                  static_cast<unsigned long long>(ns % 1000));
    return std::string(text);
  }();
  REQUIRE(trace.events[3].time_ns > trace.events[0].time_ns);
  const std::size_t first_counter = events_json.find("\"ph\":\"C\"");
  REQUIRE(first_counter != std::string::npos);
  CHECK(events_json.find("\"ts\":" + micros + ",", first_counter) < events_json.find('}', first_counter));
  CHECK(events_json.find("\"name\":\"step0\"") != std::string::npos);

  // A run recorded from its start keeps its leading annotations in the window: memory was empty then.
  analyzer::testing::TraceBuilder whole;
  whole.begin("init").end("init").segment(0x7f0000000000, 2 * MiB).alloc(0x7f0000000000, MiB, MiB);
  const analyzer::Analysis from_start = analyzer::analyze(whole.build(), analyzer::AnalysisOptions{});
  CHECK_FALSE(from_start.starts_mid_run);
  CHECK(from_start.ring_begins_at == 0);
  CHECK(from_start.window.begin == 0);
}
