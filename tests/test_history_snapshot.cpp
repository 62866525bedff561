// Snapshots from the recorder: they replay to their own layout, keep the
// newest events on overflow, survive a write/read, stay consistent while
// other threads allocate, and never take the program down.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include "allocator_support.hpp"
#include "cachealloc/analyzer/replay.hpp"
#include "cachealloc/cachealloc.h"
#include "cachealloc/history.hpp"
#include "cachealloc/snapshot/format.hpp"

using namespace cachealloc;
using snapshot::EventKind;
using test_support::KiB;
using test_support::MiB;

namespace {

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::path(CACHEALLOC_BINARY_DIR) / ("test_history_" + name);
}

using test_support::mixed_workload;

// Blocks tile their segments in order; with `with_stats`, the stats agree
// with the layout (guaranteed for an exact cut).
void check_consistent(const snapshot::Snapshot& s, bool with_stats = true) {
  std::int64_t allocated = 0, reserved = 0, active = 0, segments = 0, allocations = 0;
  for (const auto& segment : s.segments) {
    ++segments;
    reserved += static_cast<std::int64_t>(segment.total_size);
    std::uint64_t at = segment.address;
    for (const auto& block : segment.blocks) {
      REQUIRE(block.address == at);  // in order, no gap, no overlap
      at += block.size;
      if (block.state == snapshot::BlockState::active_allocated) {
        allocated += static_cast<std::int64_t>(block.size);
        ++allocations;
      }
      if (block.state != snapshot::BlockState::inactive) active += static_cast<std::int64_t>(block.size);
    }
    REQUIRE(at == segment.address + segment.total_size);
  }
  snapshot::validate(s);
  if (!with_stats) return;
  CHECK(s.stats.at("allocated_bytes.all.current") == allocated);
  CHECK(s.stats.at("reserved_bytes.all.current") == reserved);
  CHECK(s.stats.at("active_bytes.all.current") == active);
  CHECK(s.stats.at("segment.all.current") == segments);
  CHECK(s.stats.at("allocation.all.current") == allocations);
}

}  // namespace

TEST_CASE("replaying the recorded events from an empty state reproduces the final layout") {
  auto device = test_support::simulated();
  CachingAllocator allocator(device);
  HistoryRecorder recorder(allocator);  // native stacks: layout stacks must match too
  mixed_workload(allocator, *device, 7, 3000);
  const snapshot::Snapshot s = recorder.take_snapshot();
  REQUIRE(s.dropped_events == 0);
  analyzer::Replay replay({}, device->index(), s.stacks.size());
  for (const auto& event : s.events) replay.apply(event);
  CHECK(replay.anomalies().total() == 0);
  CHECK(replay.layout() == s.segments);
  check_consistent(s);
}

TEST_CASE("on ring overflow the newest max_entries events are kept and the dropped count is stated") {
  auto run = [](std::size_t max_entries) {
    auto device = test_support::simulated();
    CachingAllocator allocator(device);
    HistoryOptions options;
    options.stacks = StackCapture::none;
    options.max_entries = max_entries;
    HistoryRecorder recorder(allocator, options);
    mixed_workload(allocator, *device, 11, 400);
    return recorder.take_snapshot();
  };
  const snapshot::Snapshot all = run(1'000'000);
  const snapshot::Snapshot newest = run(100);
  REQUIRE(all.dropped_events == 0);
  REQUIRE(all.events.size() > 300);
  REQUIRE(newest.events.size() == 100);
  CHECK(newest.dropped_events == all.events.size() - 100);
  for (std::size_t i = 0; i < 100; ++i) {
    const auto& kept = newest.events[i];
    const auto& expected = all.events[all.events.size() - 100 + i];
    CHECK(kept.kind == expected.kind);
    CHECK(kept.address == expected.address);
    CHECK(kept.size == expected.size);
    CHECK(kept.aux == expected.aux);
    CHECK(kept.stream == expected.stream);
  }
}

TEST_CASE("a dumped snapshot reads back unchanged") {
  auto device = test_support::simulated();
  CachingAllocator allocator(device);
  HistoryRecorder recorder(allocator);
  {
    AnnotationScope step(recorder, "step 0");
    mixed_workload(allocator, *device, 3, 500);
  }
  snapshot::Snapshot written = recorder.take_snapshot();
  const auto path = temp_path("roundtrip.snap");
  snapshot::write_snapshot(written, path);
  const snapshot::Snapshot read = snapshot::read_snapshot(path);
  written.header.format_version = snapshot::kWholeFormatVersion;  // set by the reader
  CHECK(read == written);
  // dump_snapshot writes the same kind of file.
  REQUIRE(recorder.dump_snapshot(path));
  CHECK(snapshot::read_snapshot(path).events.size() == written.events.size());
  CHECK(read.header.source == "cachealloc");
  CHECK(read.header.pid > 0);
  CHECK(!read.header.program.empty());
  CHECK(read.devices.at(0).total_bytes == device->memory_info().total);
  CHECK(read.settings.count("config") == 1);
  std::filesystem::remove(path);
}

TEST_CASE("a dump while 4 other threads allocate and free is consistent") {
  auto device = test_support::simulated(150109880320ull, /*events_immediate=*/true);
  CachingAllocator allocator(device);
  HistoryRecorder recorder(allocator);
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < 4; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 random(t);
      const Stream stream = t % 2 ? device->create_stream() : Stream{};
      std::vector<void*> live;
      while (!stop.load(std::memory_order_relaxed)) {
        if (live.size() < 64 && (live.empty() || random() % 2)) {
          live.push_back(allocator.allocate(512 + random() % (4 * MiB), stream));
        } else {
          const std::size_t index = random() % live.size();
          allocator.deallocate(live[index]);
          live[index] = live.back();
          live.pop_back();
        }
      }
      for (void* p : live) allocator.deallocate(p);
    });
  }
  // Every dump, taken while four threads allocate and free, is consistent:
  // layout, stats and events describe the same moment.
  for (int dump = 0; dump < 5; ++dump) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const snapshot::Snapshot s = recorder.take_snapshot();
    check_consistent(s, /*stats_match_layout=*/true);
    if (s.dropped_events == 0) {  // and the events replay to exactly that layout
      analyzer::Replay replay({}, device->index(), s.stacks.size());
      for (const auto& event : s.events) replay.apply(event);
      CHECK(replay.anomalies().total() == 0);
      CHECK(replay.layout() == s.segments);
    }
  }
  stop = true;
  for (auto& w : workers) w.join();
}

TEST_CASE("a dump that cannot be written reports on stderr, stops recording and returns false") {
  CachingAllocator allocator(test_support::simulated());
  HistoryRecorder recorder(allocator);
  allocator.deallocate(allocator.allocate(4096));
  CHECK_FALSE(recorder.dump_snapshot("/nonexistent-directory/for/sure/x.snap"));
  CHECK_FALSE(recorder.recording());
  allocator.deallocate(allocator.allocate(4096));  // the program goes on
}

TEST_CASE("an OOM dumps the snapshot to the configured path") {
  CachingAllocator allocator(test_support::simulated(256 * MiB));
  HistoryOptions options;
  options.dump_on_oom = temp_path("oom.snap");
  std::filesystem::remove(options.dump_on_oom);
  HistoryRecorder recorder(allocator, options);
  void* p = allocator.allocate(100 * MiB);
  CHECK_THROWS_AS(allocator.allocate(200 * MiB), OutOfMemoryError);
  recorder.flush();
  const snapshot::Snapshot s = snapshot::read_snapshot(options.dump_on_oom);
  bool oom = false;
  for (const auto& e : s.events) oom |= e.kind == EventKind::oom;
  CHECK(oom);
  allocator.deallocate(p);
  std::filesystem::remove(options.dump_on_oom);
}

TEST_CASE("restarting recording while OOM dumps are pending never deadlocks, and the next OOM still dumps") {
  // given a recorder that dumps on OOM and a thread that keeps running out of memory
  CachingAllocator allocator(test_support::simulated(256 * MiB));
  HistoryOptions options;
  options.max_entries = 10'000;
  options.dump_on_oom = temp_path("restart_oom.snap");
  std::filesystem::remove(options.dump_on_oom);
  HistoryRecorder recorder(allocator, options);
  void* held = allocator.allocate(100 * MiB);
  std::atomic<bool> done{false};
  std::atomic<int> ooms{0};
  std::thread oom_thread([&] {
    while (!done.load()) {
      try {
        allocator.deallocate(allocator.allocate(200 * MiB));
      } catch (const OutOfMemoryError&) {
        ooms.fetch_add(1);
      }
    }
  });
  // when recording is restarted and reconfigured many times while dumps are requested
  // (at least 300 restarts, and until 20 OOMs have been reported among them)
  for (int i = 0; i < 300 || (ooms.load() < 20 && i < 100'000); ++i) {
    options.max_entries = 1'000 + static_cast<std::uint64_t>(i);
    options.stacks = i % 2 ? StackCapture::native : StackCapture::none;
    recorder.start(options);
    // flush() waits for the dumps asked for so far, however many OOMs follow
    if (i % 50 == 0) recorder.flush();
  }
  done.store(true);
  oom_thread.join();
  recorder.flush();
  CHECK(ooms.load() >= 20);
  // then a last OOM after the restarts is dumped, with its OOM event
  std::filesystem::remove(options.dump_on_oom);
  CHECK_THROWS_AS(allocator.allocate(200 * MiB), OutOfMemoryError);
  recorder.flush();
  const snapshot::Snapshot s = snapshot::read_snapshot(options.dump_on_oom);
  CHECK(std::any_of(s.events.begin(), s.events.end(), [](const auto& e) { return e.kind == EventKind::oom; }));
  allocator.deallocate(held);
  std::filesystem::remove(options.dump_on_oom);
}

TEST_CASE("the C ABI records the process-wide allocator and dumps it") {
  setenv("CACHEALLOC_DEVICE", "simulated", 1);
  cachealloc_history_options options;
  cachealloc_history_options_init(&options);
  options.max_entries = 1000;
  REQUIRE(cachealloc_record_history(&options) == CACHEALLOC_OK);
  cachealloc_annotate_begin("forward");
  void* p = cachealloc_malloc(1 << 20, 0);
  REQUIRE(p != nullptr);
  cachealloc_free(p, 1 << 20, 0);
  cachealloc_annotate_end();
  const auto path = temp_path("c_abi.snap");
  REQUIRE(cachealloc_dump_snapshot(path.c_str()) == CACHEALLOC_OK);
  const snapshot::Snapshot s = snapshot::read_snapshot(path);
  std::vector<EventKind> seen;
  for (const auto& e : s.events) seen.push_back(e.kind);
  CHECK(seen.front() == EventKind::annotation_begin);
  CHECK(seen.back() == EventKind::annotation_end);
  CHECK(std::count(seen.begin(), seen.end(), EventKind::alloc) == 1);
  options.max_frames = 0;
  CHECK(cachealloc_record_history(&options) == CACHEALLOC_INVALID_ARGUMENT);
  CHECK(std::string(cachealloc_last_error()).find("max_frames") != std::string::npos);
  CHECK(cachealloc_dump_snapshot("/nonexistent-directory/x.snap") == CACHEALLOC_IO_ERROR);
  cachealloc_stop_history();
  std::filesystem::remove(path);
}
