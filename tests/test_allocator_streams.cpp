// Per-stream pools and cross-stream frees deferred by events.
#include <doctest/doctest.h>

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
  CHECK(layout[0].blocks[0].state == snapshot::BlockState::active_pending_free);
  device->synchronize();
  void* c = allocator.allocate(512);  // processes events: a completes and merges
  allocator.deallocate(c);
  layout = allocator.layout();
  CHECK(layout.size() == 2);  // the large segment (whole again) and a small one
  for (const auto& segment : layout) CHECK(segment.blocks.size() == 1);
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
