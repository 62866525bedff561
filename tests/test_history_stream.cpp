// Streamed recordings (HistoryOptions::stream, format version 7): the same
// events and final figures as the ring, a file that reads after kill -9,
// backpressure that waits or counts what it drops, and bounded buffers.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "../recorder/history/src/ring_hook.hpp"
#include "allocator_support.hpp"
#include "file_bytes.hpp"
#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/budget.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/reports.hpp"
#include "cachealloc/analyzer/replay.hpp"
#include "cachealloc/history.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/reader.hpp"
#include "cachealloc/snapshot/stream.hpp"

using namespace cachealloc;
using test_support::KiB;
using test_support::MiB;

// Sanitized builds run a tenth of the long run (TSan makes each event ~50x dearer).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

namespace {

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::path(CACHEALLOC_BINARY_DIR) / ("test_history_stream_" + name);
}

// The stream's workload: mixed_workload without record_stream, every block freed at the end.
void workload(CachingAllocator& allocator, Device& device, unsigned seed, int operations) {
  test_support::mixed_workload(allocator, device, seed, operations, {false, true});
}

// A stack as its return addresses, so that snapshots with their own ids compare.
std::vector<std::uint64_t> ips(const snapshot::Snapshot& s, snapshot::StackId id) {
  std::vector<std::uint64_t> out;
  for (snapshot::FrameId frame : s.stacks.at(id.value).frames) out.push_back(s.frames.at(frame.value).ip);
  return out;
}

void check_same_events(const snapshot::Snapshot& streamed, const snapshot::Snapshot& ring) {
  REQUIRE(streamed.events.size() == ring.events.size());
  for (std::size_t i = 0; i < ring.events.size(); ++i) {
    const snapshot::Event& a = streamed.events[i];
    const snapshot::Event& b = ring.events[i];
    INFO("event " << i);
    REQUIRE(a.kind == b.kind);
    REQUIRE(a.address == b.address);
    REQUIRE(a.size == b.size);
    REQUIRE(a.stream == b.stream);
    REQUIRE(ips(streamed, a.stack) == ips(ring, b.stack));
    if (a.kind != snapshot::EventKind::annotation_begin && a.kind != snapshot::EventKind::annotation_end) {
      REQUIRE(a.aux == b.aux);
    } else {
      REQUIRE(streamed.strings.at(a.aux) == ring.strings.at(b.aux));
    }
  }
  for (std::size_t i = 1; i < streamed.events.size(); ++i) REQUIRE(streamed.events[i - 1].time_ns <= streamed.events[i].time_ns);
}

// The layout with each stack as its return addresses.
std::vector<std::pair<snapshot::Segment, std::vector<std::vector<std::uint64_t>>>> comparable(
    const snapshot::Snapshot& s) {
  std::vector<std::pair<snapshot::Segment, std::vector<std::vector<std::uint64_t>>>> out;
  for (snapshot::Segment segment : s.segments) {
    std::vector<std::vector<std::uint64_t>> stacks{ips(s, segment.stack)};
    segment.stack = {};
    for (snapshot::Block& block : segment.blocks) {
      stacks.push_back(ips(s, block.stack));
      block.stack = {};
    }
    out.emplace_back(std::move(segment), std::move(stacks));
  }
  return out;
}

snapshot::Snapshot read_streamed(const std::filesystem::path& path) {
  snapshot::SnapshotReader reader(path);
  REQUIRE(reader.streaming());
  snapshot::Snapshot s = reader.head();
  std::vector<snapshot::Event> block;
  while (reader.next_block(block)) s.events.insert(s.events.end(), block.begin(), block.end());
  return s;
}

std::atomic<bool> g_stall{false};
void stall_while_asked() {
  while (g_stall.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}
// Stalls the stream's writer for the scope, or until release().
struct StalledWriter {
  detail::StreamCutHook previous;
  StalledWriter() : previous(detail::replace_stream_cut_hook(stall_while_asked)) { g_stall = true; }
  void release() { g_stall = false; }
  ~StalledWriter() {
    g_stall = false;
    detail::replace_stream_cut_hook(previous);
  }
};

// `operations` in runs of 10,000, each freeing what it kept.
void long_workload(CachingAllocator& allocator, Device& device, unsigned seed, int operations) {
  for (int done = 0; done < operations; done += 10'000) workload(allocator, device, seed++, 10'000);
}

}  // namespace

TEST_CASE("a streamed recording holds the ring's events and final figures for the same workload") {
  // Given the same workload recorded into the ring and into a stream
  auto record = [](const std::filesystem::path& stream) {
    auto device = test_support::simulated();
    CachingAllocator allocator(device);
    HistoryOptions options;
    options.stream = stream;
    HistoryRecorder recorder(allocator, options);
    for (int step = 0; step < 3; ++step) {
      AnnotationScope scope(recorder, "step " + std::to_string(step));
      workload(allocator, *device, 7, 30'000);
    }
    snapshot::Snapshot ring = recorder.take_snapshot();
    recorder.stop();
    return ring;
  };
  const auto path = temp_path("roundtrip.snap");
  snapshot::Snapshot ring;
  for (const std::filesystem::path& stream : {std::filesystem::path(), path}) {  // one call site: the same stacks
    snapshot::Snapshot recorded = record(stream);
    if (stream.empty()) ring = std::move(recorded);
  }

  // When the stream is read, block by block and whole
  const snapshot::Snapshot streamed = read_streamed(path);
  const snapshot::Snapshot whole = snapshot::read_snapshot(path);

  // Then it holds every event, in order, and the same final layout and stats
  REQUIRE(ring.dropped_events == 0);
  REQUIRE(ring.events.size() > 2 * snapshot::kStreamBlockEvents);
  CHECK(streamed.header.format_version == snapshot::kStreamFormatVersion);
  CHECK(streamed.settings.count(snapshot::kStreamNoteSetting) == 0);
  check_same_events(streamed, ring);
  CHECK(comparable(streamed) == comparable(ring));
  CHECK(streamed.stats == ring.stats);
  CHECK(streamed.dropped_events == 0);
  CHECK(whole == streamed);
  // And its events replay from an empty allocator to its final layout
  analyzer::Replay replay({}, streamed.devices.at(0).index, streamed.stacks.size());
  for (const auto& event : streamed.events) replay.apply(event);
  CHECK(replay.anomalies().total() == 0);
  CHECK(replay.layout() == streamed.segments);
}

TEST_CASE("a streamed recording killed with SIGKILL reads up to its last complete chunk, with a note") {
  // Given a child process that streams a recording and never stops
  const auto path = temp_path("killed.snap");
  std::filesystem::remove(path);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto device = test_support::simulated();
    CachingAllocator allocator(device);
    HistoryOptions options;
    options.stream = path;
    HistoryRecorder recorder(allocator, options);
    for (unsigned seed = 0;; ++seed) workload(allocator, *device, seed, 10'000);
  }
  // When it is killed once several chunks are written
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline &&
         (!std::filesystem::exists(path) || std::filesystem::file_size(path) < 2 * MiB))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(std::filesystem::file_size(path) >= 2 * MiB);

  // Then the file reads, up to its last complete chunk, and says so
  const snapshot::Snapshot s = read_streamed(path);
  REQUIRE(s.settings.count(snapshot::kStreamNoteSetting) == 1);
  const std::string note = s.settings.at(snapshot::kStreamNoteSetting);
  INFO(note);
  CHECK(note.find("the recording ended without its trailer (killed?): events up to chunk") == 0);
  CHECK(s.events.size() >= snapshot::kStreamBlockEvents);
  // And its figures hold together: the events replay from empty without an
  // anomaly, to the layout the reader rebuilt
  analyzer::Replay replay({}, 0, s.stacks.size());
  for (const auto& event : s.events) replay.apply(event);
  CHECK(replay.anomalies().total() == 0);
  CHECK(replay.layout() == s.segments);
  CHECK(snapshot::read_snapshot(path) == s);
}

namespace {

// The stream at `from` without its trailer, at `to`: what a kill right
// after the last events chunk leaves.
void copy_without_trailer(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::vector<std::byte> bytes = test_support::file_bytes(from);
  auto u64 = [&](std::size_t at) {
    std::uint64_t v = 0;
    std::memcpy(&v, bytes.data() + at, sizeof v);
    return v;
  };
  std::size_t at = 24;  // the framing
  while (at + 32 <= bytes.size() && (u64(at) & 0xffffffffu) != 4) at += 32 + u64(at + 8);
  REQUIRE(at + 32 <= bytes.size());  // the trailer's header
  bytes.resize(at);
  std::ofstream out(to, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

TEST_CASE("a stream begun mid-run that loses its trailer reads from the layout the allocator had") {
  // Given blocks alive, with stacks, before a stream begins (a ring
  // recording first), and more kept while it runs
  const auto path = temp_path("midrun.snap");
  const auto cut = temp_path("midrun_cut.snap");
  auto device = test_support::simulated();
  CachingAllocator allocator(device);
  HistoryRecorder recorder(allocator, HistoryOptions{});
  std::vector<void*> before;
  for (int i = 0; i < 300; ++i) before.push_back(allocator.allocate(std::size_t(1 + i % 7) * 300 * KiB + 512 * i));
  for (std::size_t i = 0; i < before.size(); i += 3) allocator.deallocate(before[i]);
  HistoryOptions options;
  options.stream = path;
  recorder.start(options);
  workload(allocator, *device, 11, 20'000);
  std::vector<void*> during;
  for (int i = 0; i < 100; ++i) during.push_back(allocator.allocate(std::size_t(1 + i % 5) * 1 * MiB));
  for (std::size_t i = 1; i < before.size(); i += 3) allocator.deallocate(before[i]);
  recorder.stop();

  // When the stream is read whole and without its trailer
  const snapshot::Snapshot whole = read_streamed(path);
  copy_without_trailer(path, cut);
  const snapshot::Snapshot s = read_streamed(cut);

  // Then the rebuilt final layout is the allocator's, stacks and all, and
  // the events are the same
  REQUIRE(s.settings.count(snapshot::kStreamNoteSetting) == 1);
  CHECK(whole.settings.count(snapshot::kStreamNoteSetting) == 0);
  REQUIRE(s.events.size() == whole.events.size());
  CHECK(s.events == whole.events);
  CHECK(comparable(s) == comparable(whole));
  std::uint64_t allocated = 0;
  for (const auto& segment : s.segments)
    for (const auto& block : segment.blocks)
      if (block.state == snapshot::BlockState::active_allocated) allocated += block.size;
  CHECK(allocated == static_cast<std::uint64_t>(allocator.stats().allocated_bytes[stat_all].current));
  bool stacked = false;
  for (const auto& segment : s.segments)
    for (const auto& block : segment.blocks) stacked = stacked || block.stack;
  CHECK(stacked);
  // And the analyzer's figures, at events throughout the stream, are the
  // complete file's: the state it derives at the start included
  const std::size_t n = s.events.size();
  for (std::size_t end : {std::size_t{0}, n / 9, n / 4, n / 3, n / 2, 2 * n / 3, 5 * n / 6, n - 1, n}) {
    INFO("window ending at event " << end);
    analyzer::AnalysisOptions window;
    window.window.end = end;
    const analyzer::Analysis a = analyzer::analyze(s, window);
    const analyzer::Analysis b = analyzer::analyze(whole, window);
    CHECK(a.totals_at_end.allocated == b.totals_at_end.allocated);
    CHECK(a.totals_at_end.reserved == b.totals_at_end.reserved);
    CHECK(a.segments_at_end == b.segments_at_end);
    CHECK(a.peak_allocated.bytes == b.peak_allocated.bytes);
    CHECK(a.peak_reserved.bytes == b.peak_reserved.bytes);
    CHECK(a.anomalies.total() == 0);
  }
  CHECK(analyzer::analyze(whole, {}).totals_at_end.allocated ==
        static_cast<std::uint64_t>(allocator.stats().allocated_bytes[stat_all].current));
  // And the reports say where each file ends: the dump, or the last event read
  const auto overview_title = [](const analyzer::Document& doc) {
    for (const auto& section : doc.sections)
      if (const auto* group = std::get_if<analyzer::FieldGroup>(&section)) return group->title;
    return std::string();
  };
  CHECK(overview_title(analyzer::summary_report(whole, {})).ends_with("(the dump)"));
  CHECK(overview_title(analyzer::summary_report(s, {})).ends_with("(the last one read)"));
  // And check on the complete file takes the allocator's peaks, which the
  // stream reached here (it began below them): not "before the trace"
  analyzer::SnapshotEvents whole_source(whole);
  analyzer::Budgets budgets;
  budgets.peak_reserved = std::uint64_t{1} << 40;
  const analyzer::BudgetResult checked = analyzer::check_budgets(whole_source, budgets);
  CHECK(checked.figures.peak_reserved == static_cast<std::uint64_t>(allocator.stats().reserved_bytes[stat_all].peak));
  REQUIRE(checked.figures.peaks_from_stats);
  CHECK_FALSE(checked.figures.recorded_peaks_above_trace);
  CHECK(analyzer::peaks_note(checked.figures).find("which the trace reaches") != std::string::npos);
  for (void* p : during) allocator.deallocate(p);
  for (std::size_t i = 2; i < before.size(); i += 3) allocator.deallocate(before[i]);
}

TEST_CASE("a stream that cannot keep up drops events and counts them when asked to") {
  // Given a writer stalled as by a slow disk, with the smallest buffers
  auto device = test_support::simulated();
  CachingAllocator allocator(device);
  HistoryOptions options;
  options.stacks = StackCapture::none;
  options.stream = temp_path("dropping.snap");
  options.stream_buffer_bytes = 16 * MiB;
  options.stream_when_full = StreamWhenFull::drop;
  StalledWriter stalled;
  HistoryRecorder recorder(allocator, options);

  // When the program records far more than the buffers hold
  long_workload(allocator, *device, 3, 400'000);
  const StreamStatus full = recorder.stream_status();
  stalled.release();
  recorder.stop();

  // Then events were dropped, counted, and every other one is in the file
  CHECK(full.dropped_events > 0);
  CHECK(full.peak_buffer_bytes <= options.stream_buffer_bytes);
  CHECK(full.buffer_bytes >= options.stream_buffer_bytes / 4);  // the pool filled up to its limit
  const snapshot::Snapshot s = read_streamed(options.stream);
  CHECK(s.dropped_events == full.dropped_events);
  CHECK(s.events.size() + s.dropped_events == recorder.recorded_events());
}

TEST_CASE("a stream that cannot keep up makes the recording thread wait, and loses nothing") {
  // Given a writer stalled for a while, with the smallest buffers
  auto device = test_support::simulated();
  CachingAllocator allocator(device);
  HistoryOptions options;
  options.stacks = StackCapture::none;
  options.stream = temp_path("waiting.snap");
  options.stream_buffer_bytes = 16 * MiB;
  StalledWriter stalled;
  HistoryRecorder recorder(allocator, options);
  // (released once the program has had to wait, whatever the build's speed)
  std::thread release([&] {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (recorder.stream_status().waits == 0 && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    stalled.release();
  });

  // When the program records far more than the buffers hold
  long_workload(allocator, *device, 3, 400'000);
  release.join();
  recorder.stop();
  const StreamStatus status = recorder.stream_status();

  // Then it waited, nothing was dropped, the buffers stayed within bounds
  CHECK(status.waits > 0);
  CHECK(status.dropped_events == 0);
  CHECK(status.peak_buffer_bytes <= options.stream_buffer_bytes);
  const snapshot::Snapshot s = read_streamed(options.stream);
  CHECK(s.dropped_events == 0);
  CHECK(s.events.size() == recorder.recorded_events());
}

TEST_CASE("a stream's buffers stay within their bound however long the run") {
  // Given four threads recording for a long run, with 16 MiB of buffers
  auto device = test_support::simulated();
  CachingAllocator allocator(device);
  HistoryOptions options;
  options.stream = temp_path("bounded.snap");
  options.stream_buffer_bytes = 16 * MiB;
  HistoryRecorder recorder(allocator, options);
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 4; ++t)
    threads.emplace_back([&, t] { long_workload(allocator, *device, 100 * t, kSanitized ? 15'000 : 150'000); });
  for (auto& thread : threads) thread.join();
  recorder.stop();
  const StreamStatus status = recorder.stream_status();
  // Then every event is in the file, in time order, replaying cleanly, and
  // the buffers never passed the bound
  CHECK(status.peak_buffer_bytes <= options.stream_buffer_bytes);
  const snapshot::Snapshot s = read_streamed(options.stream);
  CHECK(s.events.size() == recorder.recorded_events());
  CHECK(s.events.size() > (kSanitized ? 100'000u : 1'000'000u));
  analyzer::Replay replay({}, s.devices.at(0).index, s.stacks.size());
  for (const auto& event : s.events) replay.apply(event);
  CHECK(replay.anomalies().total() == 0);
  CHECK(replay.layout() == s.segments);
}

TEST_CASE("a stream that cannot keep up loses nothing in wait mode, even while a cut waits for the allocator's locks") {
  // Given eight threads recording into the smallest buffers, and a writer
  // stalled (a slow disk) until they are full and the threads wait
  auto device = test_support::simulated();
  CachingAllocator allocator(device);
  HistoryOptions options;
  options.stacks = StackCapture::none;
  options.stream = temp_path("cut_backpressure.snap");
  options.stream_buffer_bytes = 16 * MiB;
  static std::atomic<bool> stall_locking{false};
  const detail::StreamCutHook previous_locking = detail::replace_stream_locking_hook(
      [] { while (stall_locking.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1)); });
  std::optional<StalledWriter> stalled(std::in_place);
  HistoryRecorder recorder(allocator, options);
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  // Each thread allocates and frees on a stream of its own, made once: a
  // stream a round would give the allocator a shard per stream, and an
  // empty_cache that holds every shard's lock at once passes the 64 locks
  // ThreadSanitizer can follow in one thread.
  for (unsigned t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 random(1000 * t);
      const Stream stream = device->create_stream();
      std::vector<void*> live;
      while (!done.load()) {
        if (live.size() < 64 && (live.empty() || random() % 2 == 0)) {
          live.push_back(allocator.allocate(512 + random() % (4 * MiB), random() % 2 == 0 ? Stream{} : stream));
        } else {
          const std::size_t index = random() % live.size();
          allocator.deallocate(live[index]);
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(index));
        }
      }
      for (void* p : live) allocator.deallocate(p);
    });
  auto wait_for = [&](auto condition) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!condition() && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  };
  wait_for([&] { return recorder.stream_status().waits > 0; });

  // When the writer's next cut is held before it takes the allocator's
  // locks, long enough for the threads to go through its reserve
  stall_locking = true;
  stalled.reset();
  wait_for([&] {
    const StreamStatus status = recorder.stream_status();
    return status.spilled_chunks > 0 || status.dropped_events > 0;
  });
  stall_locking = false;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  done = true;
  for (auto& thread : threads) thread.join();
  recorder.stop();
  detail::replace_stream_locking_hook(previous_locking);
  const StreamStatus status = recorder.stream_status();

  // Then nothing was dropped: the threads waited, or spilled beside the
  // stream while the cut was under way, and the buffers stayed in bounds
  CHECK(status.waits > 0);
  CHECK(status.spilled_chunks > 0);
  CHECK(status.dropped_events == 0);
  CHECK(status.peak_buffer_bytes <= options.stream_buffer_bytes);
  // And every event is in the file, in time order, replaying cleanly
  const snapshot::Snapshot s = read_streamed(options.stream);
  CHECK(s.dropped_events == 0);
  CHECK(s.events.size() == recorder.recorded_events());
  bool ordered = true;
  for (std::size_t i = 1; i < s.events.size(); ++i) ordered = ordered && s.events[i - 1].time_ns <= s.events[i].time_ns;
  CHECK(ordered);
  analyzer::Replay replay({}, s.devices.at(0).index, s.stacks.size());
  for (const auto& event : s.events) replay.apply(event);
  CHECK(replay.anomalies().total() == 0);
  CHECK(replay.layout() == s.segments);
}
