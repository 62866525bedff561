// Per-stream pools and cross-stream frees deferred by events.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "allocator_support.hpp"

using namespace cachealloc;
using namespace test_support;

TEST_CASE("a block freed on one stream is not reused on another") {
  auto device = test_device();
  CachingAllocator allocator(device);
  const Stream s1 = device->create_stream();
  void* a = allocator.allocate(3 * MiB, Stream{});
  allocator.deallocate(a);
  void* b = allocator.allocate(3 * MiB, s1);
  CHECK(b != a);
  CHECK(allocator.stats().segment[stat_all].current == 2);
  void* c = allocator.allocate(3 * MiB, Stream{});
  CHECK(c == a);
  allocator.deallocate(b);
  allocator.deallocate(c);
  allocator.empty_cache();
  device->destroy_stream(s1);
}

TEST_CASE("record_stream on the allocation stream itself defers nothing") {
  auto device = simulated();
  CachingAllocator allocator(device);
  void* a = allocator.allocate(MiB);
  allocator.record_stream(a, Stream{});
  allocator.deallocate(a);
  CHECK(allocator.stats().active_bytes[stat_all].current == 0);
}

TEST_CASE("simulated: a block used on another stream returns to its pool only after that stream's event completes") {
  auto device = simulated();
  CachingAllocator allocator(device);
  const Stream other = device->create_stream();
  void* a = allocator.allocate(3 * MiB);
  allocator.record_stream(a, other);
  allocator.deallocate(a);
  // Given the free is deferred: allocated drops at once, active stays.
  CHECK(allocator.memory_allocated() == 0);
  CHECK(allocator.stats().active_bytes[stat_all].current == static_cast<std::int64_t>(3 * MiB));
  // When a same-size request comes before the event completes, it cannot reuse the block.
  void* b = allocator.allocate(3 * MiB);
  CHECK(b != a);
  // Then after the other stream is synchronized, the next allocation completes the free.
  device->synchronize_stream(other);
  void* c = allocator.allocate(3 * MiB);
  CHECK(c == a);
  CHECK(allocator.stats().active_bytes[stat_all].current == static_cast<std::int64_t>(6 * MiB));
  allocator.deallocate(b);
  allocator.deallocate(c);
}

TEST_CASE("a deferred free completes eventually on every backend") {
  auto device = test_device();
  CachingAllocator allocator(device);
  const Stream other = device->create_stream();
  void* a = allocator.allocate(3 * MiB);
  allocator.record_stream(a, other);
  allocator.deallocate(a);
  device->synchronize();
  void* b = allocator.allocate(3 * MiB);
  CHECK(b == a);
  CHECK(allocator.stats().active_bytes[stat_all].current == static_cast<std::int64_t>(3 * MiB));
  allocator.deallocate(b);
  allocator.empty_cache();
  device->destroy_stream(other);
}

TEST_CASE("simulated: empty_cache waits for outstanding events and then releases the segment") {
  auto device = simulated();
  CachingAllocator allocator(device);
  const Stream other = device->create_stream();
  void* a = allocator.allocate(30 * MiB);
  allocator.record_stream(a, other);
  allocator.deallocate(a);
  allocator.empty_cache();
  CHECK(allocator.memory_reserved() == 0);
  CHECK(allocator.stats().num_sync_all_streams == 1);
}

TEST_CASE("simulated: a pending block does not merge until its event completes") {
  auto device = simulated();
  CachingAllocator allocator(device);
  const Stream other = device->create_stream();
  void* a = allocator.allocate(4 * MiB);
  void* b = allocator.allocate(4 * MiB);
  allocator.record_stream(a, other);
  allocator.deallocate(a);   // pending
  allocator.deallocate(b);   // b must not swallow a
  auto layout = allocator.layout();
  REQUIRE(layout.size() == 1);
  CHECK(layout[0].blocks.size() == 2);
  CHECK(layout[0].blocks[0].state == layout::BlockState::active_pending_free);
  device->synchronize();
  void* c = allocator.allocate(512);  // processes events: a completes and merges
  allocator.deallocate(c);
  layout = allocator.layout();
  CHECK(layout.size() == 2);  // the large segment (whole again) and a small one
  for (const auto& segment : layout) CHECK(segment.blocks.size() == 1);
}

TEST_CASE("simulated: a side stream's free that waited completes at the next request on any stream, as PyTorch's "
          "process_events, and its stats fold before the request's") {
  // Given a block of a side stream's pool, used on the default stream and
  // freed: it waits for the default stream's event
  auto device = simulated();
  CachingAllocator allocator(device);
  const Stream side = device->create_stream();
  void* held = allocator.allocate(8 * MiB);  // the default stream's pool holds a segment already
  void* a = allocator.allocate(3 * MiB, side);
  allocator.record_stream(a, Stream{});
  allocator.deallocate(a);
  CHECK(allocator.stats().active_bytes[stat_all].current == static_cast<std::int64_t>(11 * MiB));
  allocator.reset_peak_stats();
  // When the event has completed and the next request is the default stream's
  device->synchronize();
  void* b = allocator.allocate(2 * MiB);
  // Then the side stream's block is inactive from that request on, and the
  // peak of active bytes never held it and b together
  const MemoryStats stats = allocator.stats();
  CHECK(stats.active_bytes[stat_all].current == static_cast<std::int64_t>(10 * MiB));
  CHECK(stats.active_bytes[stat_all].peak == static_cast<std::int64_t>(11 * MiB));
  const auto layout = allocator.layout();
  for (const auto& segment : layout)
    for (const auto& block : segment.blocks)
      CHECK(block.state != layout::BlockState::active_pending_free);
  // And the side stream's pool reuses it (it stayed in its own pool)
  void* c = allocator.allocate(3 * MiB, side);
  CHECK(c == a);
  allocator.deallocate(c);
  allocator.deallocate(b);
  allocator.deallocate(held);
  allocator.empty_cache();
  CHECK(allocator.memory_reserved() == 0);
}

TEST_CASE("simulated: empty_cache after a thread worked on two streams keeps the peak those calls reached, unread") {
  // Given a cached segment of one side stream, then a segment reserved on a
  // second side stream and let go, none of it read
  auto device = simulated();
  CachingAllocator allocator(device);
  const Stream first = device->create_stream();
  const Stream second = device->create_stream();
  allocator.deallocate(allocator.allocate(3 * MiB, first));
  allocator.deallocate(allocator.allocate(4 * MiB, second));
  // When empty_cache releases both
  allocator.empty_cache();
  // Then the peak is the two segments at once, as PyTorch's
  const MemoryStats stats = allocator.stats();
  CHECK(stats.reserved_bytes[stat_all].current == 0);
  CHECK(stats.reserved_bytes[stat_all].peak == static_cast<std::int64_t>(40 * MiB));
  CHECK(stats.segment[stat_all].peak == 2);
}

TEST_CASE("one thread on two streams: the peaks are those of the calls in the order they were made, read or not") {
  // Stats are published lazily (allocator_impl.hpp, "Publishing"): folding
  // the default stream's pool before the other one's would lose the peak
  // below (the default stream sorts first). The figures are PyTorch's
  // definition: one counter over every call, in program order.
  auto device = test_device();
  CachingAllocator allocator(device);
  const Stream side = device->create_stream();
  for (const bool read_between : {false, true}) {
    allocator.reset_peak_stats();
    // Given 40 MiB kept on the side stream
    void* kept = allocator.allocate(40 * MiB, side);
    if (read_between) CHECK(allocator.memory_allocated() == 40 * MiB);
    // When 60 MiB come and go on the default stream, then 20 MiB more on the side stream
    void* passing = allocator.allocate(60 * MiB, Stream{});
    if (read_between) CHECK(allocator.max_memory_allocated() == 100 * MiB);
    allocator.deallocate(passing);
    void* more = allocator.allocate(20 * MiB, side);
    // Then the allocated peak is 100 MiB (40 + 60), reached before the 20 MiB came
    const MemoryStats stats = allocator.stats();
    CHECK(stats.allocated_bytes[stat_all].peak == 100 * MiB);
    CHECK(stats.allocated_bytes[stat_all].current == 60 * MiB);
    CHECK(stats.allocation[stat_all].peak == 2);
    CHECK(stats.allocation[stat_all].allocated == (read_between ? 6 : 3));
    allocator.deallocate(kept);
    allocator.deallocate(more);
    CHECK(allocator.memory_allocated() == 0);
    CHECK(allocator.max_memory_allocated() == 100 * MiB);
  }
  allocator.empty_cache();
  device->destroy_stream(side);
}

namespace {

// The program-order scenario above, on `allocator`, with `between` run
// before each call. Returns the allocated peak the stats report.
std::int64_t kept_passing_more_peak(CachingAllocator& allocator, Stream side, const std::function<void()>& between) {
  allocator.reset_peak_stats();
  between();
  void* kept = allocator.allocate(40 * MiB, side);
  between();
  void* passing = allocator.allocate(60 * MiB, Stream{});
  between();
  allocator.deallocate(passing);
  between();
  void* more = allocator.allocate(20 * MiB, side);
  between();
  const std::int64_t peak = allocator.stats().allocated_bytes[stat_all].peak;
  allocator.deallocate(kept);
  allocator.deallocate(more);
  return peak;
}

}  // namespace

TEST_CASE("after other threads worked on their own streams, one thread on two streams still gets its call order's peaks") {
  // Publishing in batches whenever another thread had published last would
  // make the next lone thread fold its two pools in stream order: a peak of
  // 60 MiB here instead of 100.
  auto device = test_device();
  CachingAllocator allocator(device);
  std::vector<Stream> streams;
  for (int t = 0; t < 4; ++t) streams.push_back(device->create_stream());
  std::vector<std::thread> workers;
  for (Stream stream : streams) {
    workers.emplace_back([&allocator, stream] {
      for (int i = 0; i < 5000; ++i) allocator.deallocate(allocator.allocate(4096, stream));
    });
  }
  for (auto& worker : workers) worker.join();
  const Stream side = device->create_stream();
  CHECK(kept_passing_more_peak(allocator, side, [] {}) == 100 * MiB);
  CHECK(allocator.memory_allocated() == 0);
  // And with threads still at work on their own streams meanwhile, the
  // peak is at least this thread's own: the others' 4 KiB may add to it.
  std::atomic<bool> stop{false};
  for (Stream stream : streams) {
    workers.emplace_back([&allocator, &stop, stream] {
      while (!stop.load()) allocator.deallocate(allocator.allocate(4096, stream));
    });
  }
  for (int round = 0; round < 20; ++round) {
    const std::int64_t peak = kept_passing_more_peak(allocator, side, [] {});
    CHECK(peak >= 100 * MiB);
    CHECK(peak <= 100 * MiB + 4 * 4096);
  }
  stop.store(true);
  for (auto& worker : workers)
    if (worker.joinable()) worker.join();
  CHECK(allocator.memory_allocated() == 0);
  allocator.empty_cache();
  for (Stream stream : streams) device->destroy_stream(stream);
  device->destroy_stream(side);
}

TEST_CASE("one thread going back and forth between two allocators keeps each one's call-order peaks") {
  // A thread's pending pool may belong to another allocator (a second
  // device): it is folded there before this allocator's call.
  auto device = test_device();
  CachingAllocator first(device);
  CachingAllocator second(device);
  const Stream side = device->create_stream();
  void* held = nullptr;
  int step = 0;
  // Between one allocator's calls the other allocates or frees 1 MiB on the
  // side stream, so that this thread's last pool is the other's every time.
  const auto touching = [&](CachingAllocator& other) {
    step = 0;
    return [&, target = &other] {
      if (step++ % 2 == 0) {
        held = target->allocate(1 * MiB, side);
      } else {
        target->deallocate(held);
        held = nullptr;
      }
    };
  };
  CHECK(kept_passing_more_peak(first, side, touching(second)) == 100 * MiB);
  if (held) second.deallocate(held);
  CHECK(second.max_memory_allocated() == 1 * MiB);
  CHECK(second.memory_allocated() == 0);
  CHECK(kept_passing_more_peak(second, side, touching(first)) == 100 * MiB);
  if (held) first.deallocate(held);
  first.empty_cache();
  second.empty_cache();
  device->destroy_stream(side);
}

TEST_CASE("a thread whose last allocator is gone works with the next one, which may take the same address") {
  // The thread's pending pool names a destroyed allocator: it must be
  // forgotten, not folded (under ASan a fold would be a use after free).
  auto device = test_device();
  const Stream side = device->create_stream();
  for (int round = 0; round < 50; ++round) {
    auto allocator = std::make_unique<CachingAllocator>(device);
    void* p = allocator->allocate(4096, round % 2 ? side : Stream{});
    allocator->deallocate(p);
    void* q = allocator->allocate(8192, round % 2 ? Stream{} : side);
    CHECK(allocator->memory_allocated() == 8192);
    allocator->deallocate(q);
    CHECK(allocator->max_memory_allocated() == 8192);
  }
  device->destroy_stream(side);
}

namespace {

// Shifts every address the simulated device gives out by `offset`: segments
// not aligned to 2 MiB (two pools' segments then share a 2 MiB granule of
// the allocator's segment index), or above 2^57 (past its radix table).
class ShiftedDevice : public ForwardingDevice {
 public:
  ShiftedDevice(std::shared_ptr<Device> inner, std::uintptr_t offset)
      : ForwardingDevice(std::move(inner)), offset_(offset) {}
  void* reserve(std::size_t bytes) override { return shift(inner_->reserve(bytes)); }
  void release(void* ptr, std::size_t bytes) override { inner_->release(unshift(ptr), bytes); }
  void* reserve_address_range(std::size_t bytes) override { return shift(inner_->reserve_address_range(bytes)); }
  void release_address_range(void* ptr, std::size_t bytes) override {
    inner_->release_address_range(unshift(ptr), bytes);
  }
  bool map(void* ptr, std::size_t bytes, std::size_t chunk) override { return inner_->map(unshift(ptr), bytes, chunk); }
  void unmap(void* ptr, std::size_t bytes, std::size_t chunk) override { inner_->unmap(unshift(ptr), bytes, chunk); }

 private:
  void* shift(void* ptr) const {
    return ptr ? reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(ptr) + offset_) : nullptr;
  }
  void* unshift(void* ptr) const { return reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(ptr) - offset_); }
  std::uintptr_t offset_;
};

}  // namespace

TEST_CASE("every free finds its stream's pool, whatever the segments' alignment or addresses") {
  struct Case {
    const char* what;
    std::uintptr_t offset;
    bool expandable;
  };
  const Case cases[] = {
      {"2 MiB-aligned segments", 0, false},
      {"segments 1 MiB + 512 B off 2 MiB: neighbouring pools share granules", MiB + 512, false},
      {"addresses above 2^57", (std::uintptr_t{1} << 58) + MiB, false},
      {"expandable segments 1 MiB off 2 MiB", MiB, true},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    auto inner = simulated();
    auto device = std::make_shared<ShiftedDevice>(inner, c.offset);
    AllocatorConfig config;
    config.expandable_segments = c.expandable;
    CachingAllocator allocator(device, config);
    const Stream streams[] = {Stream{}, device->create_stream(), device->create_stream()};
    // Interleaved across streams, so the segments of different pools sit
    // next to each other; small blocks fill each 2 MiB small segment.
    std::vector<std::pair<void*, Stream>> blocks;
    for (int round = 0; round < 4; ++round)
      for (Stream s : streams) blocks.emplace_back(allocator.allocate(512 * KiB, s), s);
    for (Stream s : streams) blocks.emplace_back(allocator.allocate(12 * MiB, s), s);
    for (Stream s : streams) blocks.emplace_back(allocator.allocate(3 * MiB, s), s);
    if (!c.expandable) {
      const auto segments = segment_sizes(allocator);
      CHECK(segments.size() == 9);  // 3 small, 3 of 12 MiB, 3 of 20 MiB
    }
    for (auto& [ptr, stream] : blocks) allocator.record_stream(ptr, stream);  // finds the block: no throw
    CHECK(allocator.memory_allocated() == 3 * (4 * 512 * KiB + 12 * MiB + 3 * MiB));
    // Free from the other end, so each free meets a pool other than the last.
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) CHECK(allocator.deallocate(it->first) == FreeStatus::ok);
    CHECK(allocator.memory_allocated() == 0);
    CHECK(allocator.stats().active[stat_all].current == 0);
    // Still told apart: a block already free, and an address inside one.
    CHECK(allocator.deallocate(blocks.front().first) == FreeStatus::double_free);
    CHECK(allocator.deallocate(static_cast<char*>(blocks.front().first) + 512) == FreeStatus::unknown_pointer);
    CHECK_THROWS_AS(allocator.record_stream(blocks.front().first, streams[1]), InvalidArgument);
    // After empty_cache, the addresses belong to no pool.
    allocator.empty_cache();
    CHECK(allocator.memory_reserved() == 0);
    CHECK(allocator.deallocate(blocks.back().first) == FreeStatus::unknown_pointer);
    // The same addresses, reserved again, serve their new pools.
    void* again = allocator.allocate(512 * KiB, streams[2]);
    CHECK(allocator.deallocate(again) == FreeStatus::ok);
    CHECK(allocator.memory_allocated() == 0);
  }
}

TEST_CASE("eight threads on one stream share its shard's lock without losing or doubling a block") {
  // The shard lock is contended here on every call, so its waiters sleep and
  // are woken (the lock's slow path). A block handed to two threads at once
  // would come back as a double free from the second.
  auto device = simulated();
  CachingAllocator allocator(device);
  constexpr int kThreads = 8;
  constexpr int kRounds = 4000;
  std::atomic<int> overlaps{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<void*> held;
      for (int i = 0; i < kRounds; ++i) {
        auto* p = static_cast<unsigned char*>(allocator.allocate(512 * (1 + (i + t) % 8)));
        held.push_back(p);
        if (held.size() == 4) {
          for (void* q : held) {
            if (allocator.deallocate(q) != FreeStatus::ok) overlaps.fetch_add(1);
          }
          held.clear();
        }
      }
      for (void* q : held) allocator.deallocate(q);
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(overlaps.load() == 0);
  const MemoryStats stats = allocator.stats();
  CHECK(stats.allocation[stat_all].allocated == kThreads * kRounds);
  CHECK(stats.allocation[stat_all].freed == kThreads * kRounds);
  CHECK(stats.allocated_bytes[stat_all].current == 0);
  CHECK(stats.active[stat_all].current == 0);
}

namespace {

// Holds one thread inside reserve() until released, and records whether an
// event was queried while the test says a capture is under way.
class CaptureWatchDevice : public ForwardingDevice {
 public:
  using ForwardingDevice::ForwardingDevice;
  void* reserve(std::size_t bytes) override {
    if (hold_next.exchange(false)) {
      held = true;
      while (!release_held.load()) std::this_thread::yield();
    }
    return inner_->reserve(bytes);
  }
  bool query_event(DeviceEvent event) override {
    if (capture_underway.load()) queried_during_capture = true;
    return inner_->query_event(event);
  }
  std::atomic<bool> hold_next{false}, held{false}, release_held{false};
  std::atomic<bool> capture_underway{false}, queried_during_capture{false};
};

}  // namespace

TEST_CASE("simulated: no event is queried once begin_allocate_to_pool has returned, even by a request that read "
          "before it that no capture was under way (a query would break a global-mode capture)") {
  // Given a free of the default stream's pool waiting for a side stream's
  // event, and a thread holding the default stream's lock (inside reserve)
  auto device = std::make_shared<CaptureWatchDevice>(simulated());
  CachingAllocator allocator(device);
  const Stream side = device->create_stream();
  void* a = allocator.allocate(MiB);
  allocator.record_stream(a, side);
  allocator.deallocate(a);  // pending: the side stream's event has not completed
  device->hold_next = true;
  std::thread holder([&] { allocator.deallocate(allocator.allocate(64 * MiB)); });
  while (!device->held.load()) std::this_thread::yield();
  // When a request on the default stream, which reads that no capture is
  // under way, waits for that lock before it looks at its waiting frees
  std::thread request([&] { allocator.deallocate(allocator.allocate(4096)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // And a capture begins meanwhile; the held thread then goes on
  std::thread capture([&] {
    allocator.begin_allocate_to_pool(PrivatePoolId{1, 1}, [](Stream) { return false; });
    device->capture_underway = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  device->release_held = true;
  holder.join();
  request.join();
  capture.join();
  // Then no event was queried after the capture began
  CHECK_FALSE(device->queried_during_capture.load());
  device->capture_underway = false;
  allocator.end_allocate_to_pool(PrivatePoolId{1, 1});
  allocator.release_pool(PrivatePoolId{1, 1});
  device->synchronize();
  allocator.deallocate(allocator.allocate(4096));  // completes the waiting free
  allocator.empty_cache();
  CHECK(allocator.memory_reserved() == 0);
}
