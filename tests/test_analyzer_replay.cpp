// The replay engine: layout changes per event kind, running totals, the
// derivation of the state before a ring overflow, and consistency with the
// final layout stored in the snapshot.
#include <doctest/doctest.h>

#include <algorithm>
#include <tuple>

#include "../analyzer/testing/trace_builder.hpp"
#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/replay.hpp"
#include "cachealloc/snapshot/format.hpp"

using namespace cachealloc;
using analyzer::Replay;
using analyzer::testing::TraceBuilder;
using snapshot::BlockState;

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
constexpr std::uint64_t kBase = 0x7f0000000000ull;

Replay replay_all(const snapshot::Snapshot& snap) {
  return Replay(analyzer::derive_initial_layout(snap, 0).segments, 0, snap.stacks.size());
}

std::vector<snapshot::Segment> replayed_layout(const snapshot::Snapshot& snap) {
  Replay replay = replay_all(snap);
  for (const auto& event : snap.events) replay.apply(event);
  return replay.layout();
}

std::size_t layout_differences(const snapshot::Snapshot& snap) {
  std::size_t count = 0;
  analyzer::compare_layouts(replayed_layout(snap), snap.segments, 10, count);
  return count;
}

}  // namespace

TEST_CASE("a segment_alloc creates one inactive block covering the segment") {
  // given a trace with one segment
  const auto snap = TraceBuilder().segment(kBase, 20 * kMiB).build();
  // when it is replayed
  const auto layout = replayed_layout(snap);
  // then the segment holds one inactive block and counts as reserved
  REQUIRE(layout.size() == 1);
  REQUIRE(layout[0].blocks.size() == 1);
  CHECK(layout[0].blocks[0].state == BlockState::inactive);
  CHECK(layout[0].blocks[0].size == 20 * kMiB);
}

TEST_CASE("an alloc at the front of a free block splits it and counts allocated, requested and active") {
  // given a segment and one allocation of 2 MiB (requested 2 MiB - 100)
  TraceBuilder b;
  const auto site = b.stack({"f"});
  const auto snap = b.segment(kBase, 20 * kMiB).alloc(kBase, 2 * kMiB, 2 * kMiB - 100, site).build();
  // when it is replayed
  Replay replay = replay_all(snap);
  for (const auto& e : snap.events) replay.apply(e);
  // then the block is carved out and the totals follow
  const auto layout = replay.layout();
  REQUIRE(layout[0].blocks.size() == 2);
  CHECK(layout[0].blocks[0].state == BlockState::active_allocated);
  CHECK(layout[0].blocks[1].address == kBase + 2 * kMiB);
  CHECK(layout[0].blocks[1].size == 18 * kMiB);
  CHECK(replay.totals().allocated == 2 * kMiB);
  CHECK(replay.totals().requested == 2 * kMiB - 100);
  CHECK(replay.totals().active == 2 * kMiB);
  CHECK(replay.totals().reserved == 20 * kMiB);
  CHECK(replay.live_bytes_by_stack()[site.value] == 2 * kMiB);
}

TEST_CASE("an alloc in the middle of a free block splits it three ways") {
  // given an allocation that does not start at a block boundary (no split event)
  snapshot::Snapshot snap = TraceBuilder().segment(kBase, 20 * kMiB).build();
  snapshot::Event alloc;
  alloc.kind = snapshot::EventKind::alloc;
  alloc.address = kBase + 4 * kMiB;
  alloc.size = 2 * kMiB;
  snap.events.push_back(alloc);
  // when it is replayed
  const auto layout = replayed_layout(snap);
  // then free space remains on both sides
  REQUIRE(layout[0].blocks.size() == 3);
  CHECK(layout[0].blocks[0].size == 4 * kMiB);
  CHECK(layout[0].blocks[1].state == BlockState::active_allocated);
  CHECK(layout[0].blocks[2].size == 14 * kMiB);
}

TEST_CASE("free_requested keeps a block active but no longer allocated") {
  // given an allocation whose free waits for stream events
  const auto snap = TraceBuilder().segment(kBase, 20 * kMiB).alloc(kBase, kMiB, kMiB).free_requested(kBase).build();
  // when it is replayed
  Replay replay = replay_all(snap);
  for (const auto& e : snap.events) replay.apply(e);
  // then it is pending: active, not allocated
  CHECK(replay.totals().allocated == 0);
  CHECK(replay.totals().active == kMiB);
  CHECK(replay.cache_figures().pending_free == kMiB);
  CHECK(replay.layout()[0].blocks[0].state == BlockState::active_pending_free);
}

TEST_CASE("free_completed merges the block with inactive neighbours on both sides") {
  // given three adjacent blocks, the outer two freed first
  const auto snap = TraceBuilder()
                        .segment(kBase, 20 * kMiB)
                        .alloc(kBase, kMiB, kMiB)
                        .alloc(kBase + kMiB, kMiB, kMiB)
                        .alloc(kBase + 2 * kMiB, kMiB, kMiB)
                        .free(kBase)
                        .free(kBase + 2 * kMiB)
                        .free(kBase + kMiB)
                        .build();
  // when it is replayed
  const auto layout = replayed_layout(snap);
  // then the segment is one free block again
  REQUIRE(layout[0].blocks.size() == 1);
  CHECK(layout[0].blocks[0].size == 20 * kMiB);
  CHECK(layout_differences(snap) == 0);
}

TEST_CASE("segment_release removes the segment and its reserved bytes") {
  // given two segments, one released
  const auto snap = TraceBuilder().segment(kBase, 20 * kMiB).segment(kBase + 64 * kMiB, 2 * kMiB, false).release(kBase).build();
  // when it is replayed
  Replay replay = replay_all(snap);
  for (const auto& e : snap.events) replay.apply(e);
  // then only the other segment remains
  CHECK(replay.totals().reserved == 2 * kMiB);
  REQUIRE(replay.layout().size() == 1);
  CHECK(replay.layout()[0].address == kBase + 64 * kMiB);
}

TEST_CASE("a free of an unknown block is counted as an anomaly and changes nothing") {
  // given a trace that frees an address never allocated
  const auto snap = TraceBuilder().segment(kBase, 20 * kMiB).emit(snapshot::EventKind::free_completed, kBase, kMiB, 0).build();
  // when it is replayed
  Replay replay = replay_all(snap);
  for (const auto& e : snap.events) replay.apply(e);
  // then the anomaly is counted and the totals are untouched
  CHECK(replay.anomalies().free_of_unknown_block == 1);
  CHECK(replay.totals().active == 0);
}

TEST_CASE("expandable segments grow with segment_map and shrink with segment_unmap") {
  // given an expandable segment created by a map, grown by a second map and unmapped at the tail
  snapshot::Snapshot snap = TraceBuilder().build();
  auto event = [&](snapshot::EventKind kind, std::uint64_t address, std::uint64_t size) {
    snapshot::Event e;
    e.kind = kind;
    e.address = address;
    e.size = size;
    snap.events.push_back(e);
  };
  event(snapshot::EventKind::segment_map, kBase, 2 * kMiB);
  event(snapshot::EventKind::segment_map, kBase + 2 * kMiB, 2 * kMiB);
  event(snapshot::EventKind::alloc, kBase, 3 * kMiB);
  event(snapshot::EventKind::segment_unmap, kBase + 3 * kMiB, kMiB);
  // when it is replayed
  Replay replay(std::vector<snapshot::Segment>{}, 0, 1);
  for (const auto& e : snap.events) replay.apply(e);
  // then one expandable segment holds the allocation and an unmapped tail
  const auto layout = replay.layout();
  REQUIRE(layout.size() == 1);
  CHECK(layout[0].expandable);
  CHECK(layout[0].total_size == 4 * kMiB);
  REQUIRE(layout[0].blocks.size() == 2);
  CHECK(layout[0].blocks[1].state == BlockState::unmapped);
  CHECK(replay.totals().reserved == 3 * kMiB);
  CHECK(replay.anomalies().total() == 0);
}

TEST_CASE("the replayed layout at the end equals the layout stored in the snapshot") {
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    // given a random consistent trace
    const auto snap = analyzer::testing::random_trace(seed, 20'000);
    // when it is replayed from the start
    // then the final layouts agree
    CAPTURE(seed);
    CHECK(layout_differences(snap) == 0);
  }
}

TEST_CASE("a trace that begins after a ring overflow replays to the stored final layout") {
  for (std::size_t dropped : {1ul, 100ul, 5'000ul, 15'000ul}) {
    // given a random trace whose first events were lost
    auto snap = analyzer::testing::random_trace(7, 20'000);
    snap.events.erase(snap.events.begin(), snap.events.begin() + static_cast<std::ptrdiff_t>(dropped));
    snap.dropped_events = dropped;
    // when the initial state is derived backwards and the ring replayed forwards
    const auto initial = analyzer::derive_initial_layout(snap, 0);
    // then the final layout matches and every event fits the state
    CAPTURE(dropped);
    CHECK(initial.unplaced_blocks == 0);
    CHECK(layout_differences(snap) == 0);
    Replay replay(initial.segments, 0, snap.stacks.size());
    for (const auto& e : snap.events) replay.apply(e);
    CHECK(replay.anomalies().total() == 0);
  }
}

TEST_CASE("the derived initial state equals the state a full replay had at that point") {
  // given a full trace and the same trace with its first 3000 events dropped
  const auto full = analyzer::testing::random_trace(11, 10'000);
  auto cut = full;
  cut.events.erase(cut.events.begin(), cut.events.begin() + 3000);
  cut.dropped_events = 3000;
  // when the full one is replayed to event 2999 and the cut one's start is derived
  Replay replay = replay_all(full);
  for (std::size_t i = 0; i < 3000; ++i) replay.apply(full.events[i]);
  const auto derived = analyzer::derive_initial_layout(cut, 0);
  // then both layouts agree
  std::size_t count = 0;
  const auto lines = analyzer::compare_layouts(derived.segments, replay.layout(), 5, count);
  for (const auto& line : lines) MESSAGE(line);
  CHECK(count == 0);
}

TEST_CASE("allocated + pending + cached free = reserved and active = requested + rounding waste at every event") {
  // given a random trace with deferred frees
  const auto snap = analyzer::testing::random_trace(3, 5'000);
  Replay replay = replay_all(snap);
  std::size_t checked = 0;
  for (std::size_t i = 0; i < snap.events.size(); ++i) {
    // when each event is applied
    replay.apply(snap.events[i]);
    const auto t = replay.totals();
    const auto f = replay.cache_figures(i % 50 == 0);
    // then the identities hold
    REQUIRE(t.allocated + f.pending_free + f.cached_free == t.reserved);
    REQUIRE(t.requested + f.rounding_waste == t.active);
    REQUIRE(f.inactive_split + f.releasable <= f.cached_free);
    if (i % 50 == 0) REQUIRE(f.largest_free <= f.cached_free);
    ++checked;
  }
  CHECK(checked == snap.events.size());
}

TEST_CASE("a total made impossible is refused at the event that made it; split, merge and annotations change none") {
  // Given events that change no total (Replay checks the totals only after
  // the kinds that can change them), then a segment of 2^61 bytes, mapped
  // or allocated: reserved past 2^60, which no device has
  auto event = [](snapshot::EventKind kind, std::uint64_t address, std::uint64_t size) {
    snapshot::Event e;
    e.kind = kind;
    e.address = address;
    e.size = size;
    return e;
  };
  for (const snapshot::EventKind kind : {snapshot::EventKind::segment_map, snapshot::EventKind::segment_alloc}) {
    CAPTURE(static_cast<int>(kind));
    Replay replay(std::vector<snapshot::Segment>{}, 0, 1);
    // When the first four are applied, then nothing is refused
    CHECK_NOTHROW(replay.apply(event(snapshot::EventKind::split, kBase, kMiB)));
    CHECK_NOTHROW(replay.apply(event(snapshot::EventKind::merge, kBase, kMiB)));
    CHECK_NOTHROW(replay.apply(event(snapshot::EventKind::annotation_begin, 0, 0)));
    CHECK_NOTHROW(replay.apply(event(snapshot::EventKind::annotation_end, 0, 0)));
    // and the fifth is refused, named by its index
    std::string refused;
    try {
      replay.apply(event(kind, kBase, std::uint64_t{1} << 61));
    } catch (const snapshot::SnapshotError& error) {
      refused = error.what();
    }
    CHECK(refused.find("replaying event 4 gives an impossible state on device 0") != std::string::npos);
  }
}

namespace {

std::vector<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::uint32_t>> sorted_blocks(
    const std::vector<Replay::LiveBlock>& blocks) {
  std::vector<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::uint32_t>> result;
  for (const Replay::LiveBlock& b : blocks) result.emplace_back(b.address, b.size, b.requested, b.stack.value);
  std::sort(result.begin(), result.end());
  return result;
}

}  // namespace

TEST_CASE("the analysis keeps the allocations live at the allocated or reserved peak as a replay to the peak finds them") {
  using LiveAtPeak = analyzer::AnalysisOptions::LiveAtPeak;
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    for (std::size_t dropped : {0ul, 2'000ul}) {
      for (const LiveAtPeak which : {LiveAtPeak::allocated, LiveAtPeak::reserved}) {
        for (const analyzer::EventWindow window : {analyzer::EventWindow{}, analyzer::EventWindow{3'000, 9'000}}) {
          // given a random trace, whole or begun after a ring overflow, and a window
          auto snap = analyzer::testing::random_trace(seed, 20'000);
          snap.events.erase(snap.events.begin(), snap.events.begin() + static_cast<std::ptrdiff_t>(dropped));
          snap.dropped_events = dropped;
          // when the analysis keeps the live set at the peak
          analyzer::AnalysisOptions options;
          options.window = window;
          options.live_at_peak = which;
          const analyzer::Analysis a = analyzer::analyze(snap, options);
          // then it holds what a replay to the peak's event holds
          CAPTURE(seed);
          CAPTURE(dropped);
          CAPTURE(window.begin);
          REQUIRE(a.live_at_peak.has_value());
          const analyzer::Peak& peak = which == LiveAtPeak::allocated ? a.peak_allocated : a.peak_reserved;
          const std::size_t until =
              peak.event == analyzer::kNoEvent ? (a.window.begin == 0 ? analyzer::kNoEvent : a.window.begin - 1) : peak.event;
          std::vector<Replay::LiveBlock> replayed;
          analyzer::replay_to(snap, a.device, until, [&](const Replay& replay) {
            replay.for_each_allocated([&](const Replay::LiveBlock& b) { replayed.push_back(b); });
          });
          CHECK(!replayed.empty());
          CHECK(sorted_blocks(*a.live_at_peak) == sorted_blocks(replayed));
        }
      }
    }
  }
}

TEST_CASE("a trace the replay finds damaged leaves the live set at the peak to a replay") {
  // given a trace with a free of a block that was never allocated
  const auto snap = TraceBuilder()
                        .segment(kBase, 20 * kMiB)
                        .alloc(kBase, kMiB, kMiB)
                        .emit(snapshot::EventKind::free_completed, kBase + kMiB, kMiB, 0)
                        .alloc(kBase + 2 * kMiB, kMiB, kMiB)
                        .build();
  // when the analysis is asked for the live set at the allocated peak
  analyzer::AnalysisOptions options;
  options.live_at_peak = analyzer::AnalysisOptions::LiveAtPeak::allocated;
  const analyzer::Analysis a = analyzer::analyze(snap, options);
  // then it leaves it to replay_to
  CHECK(a.anomalies.total() != 0);
  CHECK(!a.live_at_peak.has_value());
}
