// The recorder under load, for TSan (dev.sh tsan runs it): 8 threads x 100k
// operations (10k under a sanitizer, or CACHEALLOC_STRESS_OPS) on 4 streams,
// with record_stream, empty_cache and OOMs under a 1 GiB cap, and a dump in
// the middle. Every event the threads caused is in the trace, counted kind by
// kind against what they did, and the trace replays to the final layout.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "allocator_support.hpp"
#include "cachealloc/analyzer/replay.hpp"
#include "cachealloc/history.hpp"
#include "cachealloc/snapshot/format.hpp"

#include "../recorder/history/src/ring_hook.hpp"

using namespace cachealloc;
using snapshot::EventKind;
using test_support::MiB;

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int kDefaultOps = 10'000;
#else
constexpr int kDefaultOps = 100'000;
#endif

int operations_per_thread() {
  if (const char* text = std::getenv("CACHEALLOC_STRESS_OPS")) return std::max(1, std::atoi(text));
  return kDefaultOps;
}

// CLOCK_MONOTONIC ns, the clock snapshot times are in (steady_clock on Linux).
std::uint64_t monotonic_now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

// Replays `s` from nothing and checks it goes through with no anomaly to
// the snapshot's own layout; returns the replay's totals.
analyzer::Totals replay_without_anomalies(const snapshot::Snapshot& s, std::int32_t device) {
  analyzer::Replay replay({}, device, s.stacks.size());
  for (const auto& e : s.events) replay.apply(e);
  const analyzer::ReplayAnomalies& anomalies = replay.anomalies();
  INFO("alloc_outside_free_block " << anomalies.alloc_outside_free_block << ", free_of_unknown_block "
       << anomalies.free_of_unknown_block << ", unknown_segment " << anomalies.unknown_segment
       << ", segment_released_with_active_blocks " << anomalies.segment_released_with_active_blocks);
  CHECK(anomalies.total() == 0);
  CHECK(replay.layout() == s.segments);
  return replay.totals();
}

struct Counts {
  std::atomic<std::uint64_t> allocs{0}, frees{0}, ooms{0}, empty_caches{0}, record_streams{0};
};

}  // namespace

TEST_CASE("8 threads x 100k operations with recording on: every event is recorded and the trace replays to the layout") {
  constexpr int kThreads = 8;
  const int ops = operations_per_thread();
  // Given a 1 GiB device, 4 streams and a recorder whose ring holds everything
  auto device = test_support::simulated(1024 * MiB);
  CachingAllocator allocator(device);
  std::vector<Stream> streams{Stream{}};
  for (int s = 0; s < 3; ++s) streams.push_back(device->create_stream());
  HistoryOptions options;
  options.max_entries = static_cast<std::uint64_t>(kThreads) * ops * 8 + 100'000;
  HistoryRecorder recorder(allocator, options);
  Counts counts;
  std::atomic<int> done_ops{0};

  // When 8 threads allocate (512 B to 96 MiB), free, record_stream, empty the cache and hit the cap
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 random(1000 + t);
      std::vector<void*> live;
      for (int i = 0; i < ops; ++i) {
        const unsigned choice = random() % 100;
        if (choice < 50 && live.size() < 24) {
          static constexpr std::size_t kSizes[] = {512, 4096, 60'000, 1 * MiB, 3 * MiB, 12 * MiB, 40 * MiB, 96 * MiB};
          const std::size_t size = kSizes[random() % 8] + random() % 4096;
          const Stream stream = streams[random() % streams.size()];
          try {
            void* p = allocator.allocate(size, stream);
            counts.allocs.fetch_add(1, std::memory_order_relaxed);
            if (random() % 8 == 0) {
              allocator.record_stream(p, streams[random() % streams.size()]);
              counts.record_streams.fetch_add(1, std::memory_order_relaxed);
            }
            live.push_back(p);
          } catch (const OutOfMemoryError&) {
            counts.ooms.fetch_add(1, std::memory_order_relaxed);
          }
        } else if (choice < 97 && !live.empty()) {
          const std::size_t index = random() % live.size();
          allocator.deallocate(live[index]);
          counts.frees.fetch_add(1, std::memory_order_relaxed);
          live[index] = live.back();
          live.pop_back();
        } else if (choice == 97) {
          device->synchronize();
        } else if (choice == 98 && i % 50 == 0) {
          allocator.empty_cache();
          counts.empty_caches.fetch_add(1, std::memory_order_relaxed);
        }
        done_ops.fetch_add(1, std::memory_order_relaxed);
      }
      for (void* p : live) {
        allocator.deallocate(p);
        counts.frees.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  // and a dump is taken in the middle of it
  while (done_ops.load(std::memory_order_relaxed) < kThreads * ops / 2) std::this_thread::yield();
  const auto middle = std::filesystem::path(CACHEALLOC_BINARY_DIR) / "test_history_stress.snap";
  REQUIRE(recorder.dump_snapshot(middle));
  for (auto& thread : threads) thread.join();
  device->synchronize();
  allocator.empty_cache();
  counts.empty_caches.fetch_add(1);

  // Then the middle dump is a consistent snapshot of its moment
  const snapshot::Snapshot at_middle = snapshot::read_snapshot(middle);
  snapshot::validate(at_middle);
  CHECK(at_middle.dropped_events == 0);
  {
    analyzer::Replay replay({}, device->index(), at_middle.stacks.size());
    for (const auto& e : at_middle.events) replay.apply(e);
    // Every event's time was read under the locks that guard what it
    // changed, so time order is an order the allocator went through.
    CHECK(replay.anomalies().total() == 0);
    CHECK(replay.layout() == at_middle.segments);
  }
  std::filesystem::remove(middle);

  // and the final trace holds every event the threads caused, kind by kind
  const snapshot::Snapshot s = recorder.take_snapshot();
  snapshot::validate(s);
  REQUIRE(s.dropped_events == 0);
  std::uint64_t by_kind[snapshot::kEventKindCount] = {};
  for (const auto& e : s.events) ++by_kind[static_cast<int>(e.kind)];
  MESSAGE(kThreads << " x " << ops << " ops: " << counts.allocs.load() << " allocs, " << counts.frees.load()
                   << " frees, " << counts.ooms.load() << " OOMs, " << counts.record_streams.load()
                   << " record_stream, " << counts.empty_caches.load()
                   << " empty_cache, " << s.events.size() << " events");
  CHECK(counts.ooms.load() > 0);
  CHECK(counts.record_streams.load() > 0);
  CHECK(by_kind[static_cast<int>(EventKind::alloc)] == counts.allocs.load());
  CHECK(by_kind[static_cast<int>(EventKind::free_requested)] == counts.frees.load());
  CHECK(by_kind[static_cast<int>(EventKind::free_completed)] == counts.frees.load());  // every stream synchronized
  CHECK(by_kind[static_cast<int>(EventKind::oom)] == counts.ooms.load());
  CHECK(by_kind[static_cast<int>(EventKind::empty_cache)] == counts.empty_caches.load());
  // and it replays from nothing to the final layout, with the allocator's own counters
  const analyzer::Totals totals = replay_without_anomalies(s, device->index());
  const auto stats = allocator.memory_stats();
  CHECK(totals.allocated == 0);
  CHECK(stats.at("allocated_bytes.all.current") == 0);
  CHECK(static_cast<std::int64_t>(totals.reserved) == stats.at("reserved_bytes.all.current"));
  CHECK(stats.at("num_ooms") == static_cast<std::int64_t>(counts.ooms.load()));
}

namespace {

// Every 40th copy into the ring waits 2 ms first (detail::replace_ring_copy_hook).
std::atomic<int> g_copies{0};
void slow_copy() {
  if (g_copies.fetch_add(1, std::memory_order_relaxed) % 40 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

// The events one thread causes with `pairs` 4 KiB pairs on its own stream.
std::size_t events_of_pairs(int pairs) {
  auto device = test_support::simulated(1024 * MiB);
  CachingAllocator allocator(device);
  const Stream stream = device->create_stream();
  HistoryOptions options;
  options.max_entries = 1u << 22;
  HistoryRecorder recorder(allocator, options);
  for (int i = 0; i < pairs; ++i) allocator.deallocate(allocator.allocate(4096, stream));
  const std::size_t events = recorder.take_snapshot().events.size();
  recorder.stop();
  allocator.empty_cache();
  device->destroy_stream(stream);
  return events;
}

}  // namespace

TEST_CASE("8 threads on a ring of three chunks: chunks copied outside the ring lock are never shared between threads") {
  // Threads copy their full staging chunk into the ring outside ring_lock
  // (ring.cpp, flush). With a ring this small, and some copies held open
  // for 2 ms, it goes round while a copy is still under way; the next thread
  // to reach that chunk must wait for it, or it would write its events into
  // the chunk the other thread then overwrites: events lost without being
  // counted as dropped, or one thread's events given to another.
  constexpr int kThreads = 8;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  constexpr int kPairs = 3'000;
#else
  constexpr int kPairs = 30'000;
#endif
  auto device = test_support::simulated(1024 * MiB);
  CachingAllocator allocator(device);
  std::vector<Stream> streams;
  for (int t = 0; t < kThreads; ++t) streams.push_back(device->create_stream());
  HistoryOptions options;
  options.max_entries = 500;  // two chunks (each holds at least Chunk::kMinEvents), plus one
  HistoryRecorder recorder(allocator, options);
  const detail::RingCopyHook previous = detail::replace_ring_copy_hook(slow_copy);
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < kPairs; ++i) allocator.deallocate(allocator.allocate(4096, streams[static_cast<std::size_t>(t)]));
    });
  }
  go.store(true);
  for (auto& thread : threads) thread.join();
  detail::replace_ring_copy_hook(previous);
  const snapshot::Snapshot s = recorder.take_snapshot();
  snapshot::validate(s);
  // Then the ring kept its newest events and let the rest go, every one counted
  CHECK(g_copies.load() > 40);
  CHECK(s.dropped_events > 0);
  CHECK(s.events.size() <= options.max_entries);
  CHECK(s.dropped_events + s.events.size() == kThreads * events_of_pairs(kPairs));
  REQUIRE(!s.events.empty());
  // and every thread's events are on that thread's own stream: one stream per thread
  std::vector<std::pair<std::uint32_t, std::uint64_t>> thread_streams;
  std::size_t mixed = 0;
  for (const auto& e : s.events) {
    auto it = std::find_if(thread_streams.begin(), thread_streams.end(), [&](const auto& p) { return p.first == e.thread; });
    if (it == thread_streams.end()) thread_streams.emplace_back(e.thread, e.stream);
    else if (it->second != e.stream) ++mixed;
  }
  CHECK(mixed == 0);
  for (const auto& [thread, stream] : thread_streams)
    CHECK(std::count_if(streams.begin(), streams.end(), [&](Stream x) { return x.handle == stream; }) == 1);
  recorder.stop();
  allocator.empty_cache();
  for (Stream stream : streams) device->destroy_stream(stream);
}

TEST_CASE("a block handed between two threads whose clocks disagree by a second still replays in the allocator's order") {
  // The recorder times events with an unordered clock read and takes their
  // order from the pool's order word (AllocatorEvent::order). Given two
  // threads, one whose reads run a second ahead, passing one block to and
  // fro: each frees what the other allocated, and allocates it again
  auto device = test_support::simulated(256 * MiB);
  CachingAllocator allocator(device);
  HistoryOptions options;
  options.max_entries = 1u << 16;
  HistoryRecorder recorder(allocator, options);
  constexpr int kRounds = 2'000;
  std::atomic<int> turn{0};
  std::atomic<void*> block{nullptr};
  auto player = [&](int me, std::int64_t skew) {
    detail::set_thread_clock_skew(skew);
    for (int round = 0; round < kRounds; ++round) {
      while (turn.load(std::memory_order_acquire) != me) std::this_thread::yield();
      if (void* mine = block.load()) allocator.deallocate(mine);
      block.store(allocator.allocate(4096));
      turn.store(1 - me, std::memory_order_release);
    }
    detail::set_thread_clock_skew(0);
  };
  std::thread ahead(player, 0, std::int64_t{3'000'000'000});
  std::thread behind(player, 1, std::int64_t{0});
  ahead.join();
  behind.join();
  allocator.deallocate(block.load());
  // When the trace is dumped (sorted by time) and replayed
  const snapshot::Snapshot s = recorder.take_snapshot();
  snapshot::validate(s);
  REQUIRE(s.dropped_events == 0);
  analyzer::Replay replay({}, device->index(), s.stacks.size());
  for (const auto& e : s.events) replay.apply(e);
  // Then every free follows its alloc, as the allocator went through them
  const analyzer::ReplayAnomalies& anomalies = replay.anomalies();
  INFO("alloc_outside_free_block " << anomalies.alloc_outside_free_block << ", free_of_unknown_block "
       << anomalies.free_of_unknown_block);
  CHECK(anomalies.total() == 0);
  CHECK(replay.layout() == s.segments);
  std::size_t allocs = 0;
  for (const auto& e : s.events) allocs += e.kind == EventKind::alloc;
  CHECK(allocs == 2 * kRounds);
}

TEST_CASE("with the coarse clock, 4 threads churning segments across streams still replay in the allocator's order") {
  // CLOCK_MONOTONIC_COARSE gives every event of one kernel tick the same
  // reading; the order words, and CLOCK_MONOTONIC after device calls, must
  // still order them. Given a small device, so that segments are released
  // and their addresses handed to other pools within one tick
  const int ops = std::max(1, operations_per_thread() / 4);
  auto device = test_support::simulated(256 * MiB);
  CachingAllocator allocator(device);
  std::vector<Stream> streams{Stream{}, device->create_stream(), device->create_stream()};
  HistoryOptions options;
  options.clock = HistoryClock::coarse;
  options.max_entries = static_cast<std::uint64_t>(4) * ops * 8 + 100'000;
  const std::uint64_t before = monotonic_now_ns();
  HistoryRecorder recorder(allocator, options);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 random(77 + t);
      std::vector<void*> live;
      for (int i = 0; i < ops; ++i) {
        if (random() % 2 == 0 && live.size() < 12) {
          static constexpr std::size_t kSizes[] = {512, 4096, 1 * MiB, 3 * MiB, 24 * MiB};
          try {
            live.push_back(allocator.allocate(kSizes[random() % 5] + random() % 4096, streams[random() % 3]));
          } catch (const OutOfMemoryError&) {
          }
        } else if (!live.empty()) {
          const std::size_t index = random() % live.size();
          allocator.deallocate(live[index]);
          live[index] = live.back();
          live.pop_back();
        }
        if (i % 64 == 0) allocator.empty_cache();
      }
      for (void* p : live) allocator.deallocate(p);
    });
  }
  for (auto& thread : threads) thread.join();
  allocator.empty_cache();
  // When the trace is dumped and replayed
  const snapshot::Snapshot s = recorder.take_snapshot();
  const std::uint64_t after = monotonic_now_ns();
  snapshot::validate(s);
  REQUIRE(s.dropped_events == 0);
  REQUIRE(s.events.size() > 1000);
  // Then it replays with no anomaly to the allocator's layout and counters
  const analyzer::Totals totals = replay_without_anomalies(s, device->index());
  CHECK(static_cast<std::int64_t>(totals.reserved) ==
        allocator.memory_stats().at("reserved_bytes.all.current"));
  // and the snapshot says which clock timed it, and to what resolution
  CHECK(s.settings.at("history.clock") == "coarse");
  const std::uint64_t resolution = std::stoull(s.settings.at("history.clock_resolution_ns"));
  CHECK(resolution > 0);
  // and its times are CLOCK_MONOTONIC ns within the recording, give or
  // take a few ticks (the coarse clock lags by one, more on a tickless
  // kernel whose CPUs were idle)
  MESSAGE("coarse clock resolution " << resolution << " ns; first event " << std::int64_t(before - s.events.front().time_ns)
                                     << " ns before the recorder started");
  CHECK(s.events.front().time_ns + 4 * resolution >= before);
  CHECK(s.events.back().time_ns <= after + resolution);
}
