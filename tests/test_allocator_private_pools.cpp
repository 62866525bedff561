// Private pools (PyTorch's MempoolId_t: CUDA graph capture, torch.cuda.MemPool).
// PyTorch's own figures for the same calls are compared on the H200 by
// python/tests/torch_api_probe.py (docs/VERIFICATION.md, "The PyTorch drop-in").
#include <doctest/doctest.h>

#include <thread>

#include "allocator_support.hpp"

using namespace cachealloc;
using namespace test_support;

namespace {
constexpr PrivatePoolId kGraphPool{1, 0};
constexpr PrivatePoolId kOtherPool{0, 7};
StreamFilter every_stream() {
  return [](Stream) { return true; };
}
}  // namespace

TEST_CASE("a block freed in a private pool is reused by that pool only") {
  auto device = simulated();
  CachingAllocator allocator(device);
  allocator.begin_allocate_to_pool(kGraphPool, every_stream());
  void* in_pool = allocator.allocate(3 * MiB);
  allocator.deallocate(in_pool);
  void* again = allocator.allocate(3 * MiB);
  CHECK(again == in_pool);  // the pool's own cached block
  allocator.deallocate(again);
  allocator.end_allocate_to_pool(kGraphPool);
  // When the default pool asks for the same size, it gets a segment of its own.
  void* outside = allocator.allocate(3 * MiB);
  CHECK(outside != in_pool);
  CHECK(allocator.stats().segment[stat_all].current == 2);
  allocator.deallocate(outside);
}

TEST_CASE("only the streams the filter accepts allocate from the private pool") {
  auto device = simulated();
  CachingAllocator allocator(device);
  const Stream capturing = device->create_stream();
  const Stream other = device->create_stream();
  allocator.begin_allocate_to_pool(kGraphPool, [capturing](Stream s) { return s == capturing; });
  void* a = allocator.allocate(MiB, capturing);
  void* b = allocator.allocate(MiB, other);
  allocator.end_allocate_to_pool(kGraphPool);
  const std::map<std::uintptr_t, PrivatePoolId> owners = allocator.private_segments();
  REQUIRE(owners.size() == 1);
  const std::uintptr_t segment = owners.begin()->first;
  CHECK(owners.begin()->second == kGraphPool);
  CHECK(reinterpret_cast<std::uintptr_t>(a) >= segment);
  CHECK(reinterpret_cast<std::uintptr_t>(a) < segment + 2 * MiB);
  CHECK((reinterpret_cast<std::uintptr_t>(b) < segment || reinterpret_cast<std::uintptr_t>(b) >= segment + 2 * MiB));
  allocator.deallocate(a);
  allocator.deallocate(b);
}

TEST_CASE("empty_cache keeps a pool's free segments while the pool is used and releases them after release_pool") {
  auto device = simulated();
  CachingAllocator allocator(device);
  allocator.begin_allocate_to_pool(kGraphPool, every_stream());
  allocator.deallocate(allocator.allocate(30 * MiB));
  allocator.end_allocate_to_pool(kGraphPool);
  CHECK(allocator.pool_use_count(kGraphPool) == 1);
  allocator.empty_cache();
  CHECK(allocator.memory_reserved() == 30 * MiB);  // the graph may replay into it
  allocator.empty_cache(kGraphPool);
  CHECK(allocator.memory_reserved() == 30 * MiB);  // still in use
  allocator.release_pool(kGraphPool);
  CHECK(allocator.pool_use_count(kGraphPool) == 0);
  allocator.empty_cache(kOtherPool);  // another pool's id releases nothing of this one
  CHECK(allocator.memory_reserved() == 30 * MiB);
  allocator.empty_cache();
  CHECK(allocator.memory_reserved() == 0);
  CHECK(allocator.stats().num_device_free == 1);
  CHECK(allocator.private_segments().empty());
}

TEST_CASE("emptying one released pool settles that pool's pending frees and counts a sync, as PyTorch 2.11 does") {
  auto device = simulated();
  CachingAllocator allocator(device);
  const Stream other = device->create_stream();
  allocator.begin_allocate_to_pool(kGraphPool, every_stream());
  void* in_pool = allocator.allocate(30 * MiB);
  allocator.end_allocate_to_pool(kGraphPool);
  allocator.record_stream(in_pool, other);
  allocator.deallocate(in_pool);  // waits for the other stream
  allocator.release_pool(kGraphPool);
  const std::int64_t syncs = allocator.stats().num_sync_all_streams;
  allocator.empty_cache(kOtherPool);  // a pool that does not exist: no sync
  CHECK(allocator.stats().num_sync_all_streams == syncs);
  allocator.empty_cache(kGraphPool);
  CHECK(allocator.stats().num_sync_all_streams == syncs + 1);
  CHECK(allocator.memory_reserved() == 0);  // the pending free settled, the segment released
  CHECK(allocator.stats().active_bytes[stat_all].current == 0);
}

TEST_CASE("empty_cache during a capture keeps the default pool's cached blocks and syncs nothing") {
  auto device = simulated();
  CachingAllocator allocator(device);
  allocator.deallocate(allocator.allocate(30 * MiB));
  allocator.begin_allocate_to_pool(kGraphPool, [](Stream) { return false; });
  const std::int64_t syncs = allocator.stats().num_sync_all_streams;
  allocator.empty_cache();
  CHECK(allocator.memory_reserved() == 30 * MiB);
  CHECK(allocator.stats().num_sync_all_streams == syncs);
  allocator.end_allocate_to_pool(kGraphPool);
  allocator.empty_cache();
  CHECK(allocator.memory_reserved() == 0);
  CHECK(allocator.stats().num_sync_all_streams == syncs + 1);
}

TEST_CASE("a released pool whose blocks are still live keeps them until they are freed") {
  auto device = simulated();
  CachingAllocator allocator(device);
  allocator.begin_allocate_to_pool(kGraphPool, every_stream());
  void* output = allocator.allocate(4 * MiB);  // a graph output the program still holds
  allocator.end_allocate_to_pool(kGraphPool);
  allocator.release_pool(kGraphPool);
  allocator.empty_cache();
  CHECK(allocator.memory_reserved() == 20 * MiB);
  CHECK(allocator.memory_allocated() == 4 * MiB);
  allocator.deallocate(output);
  allocator.empty_cache();
  CHECK(allocator.memory_reserved() == 0);
}

TEST_CASE("use counts: create_or_incref_pool and begin_allocate_to_pool each add a use") {
  auto device = simulated();
  CachingAllocator allocator(device);
  CHECK(allocator.pool_use_count(kGraphPool) == 0);
  allocator.create_or_incref_pool(kGraphPool);
  allocator.begin_allocate_to_pool(kGraphPool, every_stream());
  allocator.end_allocate_to_pool(kGraphPool);
  CHECK(allocator.pool_use_count(kGraphPool) == 2);
  allocator.release_pool(kGraphPool);
  allocator.release_pool(kGraphPool);
  CHECK(allocator.pool_use_count(kGraphPool) == 0);
  CHECK_THROWS_AS(allocator.release_pool(kGraphPool), InvalidArgument);
}

TEST_CASE("misuse of private pools is refused") {
  auto device = simulated();
  CachingAllocator allocator(device);
  CHECK_THROWS_AS(allocator.end_allocate_to_pool(kGraphPool), InvalidArgument);
  CHECK_THROWS_AS(allocator.create_or_incref_pool(PrivatePoolId{}), InvalidArgument);
  CHECK_THROWS_AS(allocator.begin_allocate_to_pool(kGraphPool, StreamFilter{}), InvalidArgument);
  allocator.begin_allocate_to_pool(kGraphPool, every_stream());
  CHECK_THROWS_AS(allocator.begin_allocate_to_pool(kGraphPool, every_stream()), InvalidArgument);
  allocator.end_allocate_to_pool(kGraphPool);
}

TEST_CASE("MemPool's filter: only the thread that entered the pool allocates from it") {
  auto device = simulated();
  CachingAllocator allocator(device);
  const std::thread::id me = std::this_thread::get_id();
  allocator.begin_allocate_to_pool(kOtherPool, [me](Stream) { return std::this_thread::get_id() == me; });
  void* mine = allocator.allocate(MiB);
  void* theirs = nullptr;
  std::thread([&] { theirs = allocator.allocate(MiB); }).join();
  allocator.end_allocate_to_pool(kOtherPool);
  const auto owners = allocator.private_segments();
  REQUIRE(owners.size() == 1);
  const std::uintptr_t segment = owners.begin()->first;
  CHECK(reinterpret_cast<std::uintptr_t>(mine) - segment < 2 * MiB);
  CHECK(reinterpret_cast<std::uintptr_t>(theirs) - segment >= 2 * MiB);
  allocator.deallocate(mine);
  allocator.deallocate(theirs);
}

TEST_CASE("simulated: during a capture a free that needs stream events waits until the capture ends") {
  auto device = simulated();
  CachingAllocator allocator(device);
  const Stream other = device->create_stream();
  void* a = allocator.allocate(3 * MiB);
  allocator.record_stream(a, other);
  allocator.begin_allocate_to_pool(kGraphPool, [](Stream) { return false; });  // captures no stream of ours
  allocator.deallocate(a);
  allocator.end_allocate_to_pool(kGraphPool);
  // Given the other stream is synchronized after the capture: had the event
  // been recorded during the capture it would now be complete and `a` reused.
  device->synchronize_stream(other);
  void* b = allocator.allocate(3 * MiB);  // records the deferred event now
  CHECK(b != a);
  CHECK(allocator.stats().active_bytes[stat_all].current == static_cast<std::int64_t>(6 * MiB));
  device->synchronize_stream(other);
  void* c = allocator.allocate(3 * MiB);
  CHECK(c == a);
  allocator.deallocate(b);
  allocator.deallocate(c);
}

TEST_CASE("a private pool takes no expandable segments, the default pool still does") {
  auto device = simulated();
  AllocatorConfig config = parse_config("expandable_segments:True");
  CachingAllocator allocator(device, config);
  allocator.begin_allocate_to_pool(kGraphPool, every_stream());
  void* in_pool = allocator.allocate(5 * MiB);
  allocator.end_allocate_to_pool(kGraphPool);
  void* outside = allocator.allocate(5 * MiB);
  for (const layout::Segment& segment : allocator.layout()) {
    const bool has_in_pool = reinterpret_cast<std::uintptr_t>(in_pool) - segment.address < segment.total_size;
    if (has_in_pool) {
      CHECK_FALSE(segment.expandable);
      CHECK(segment.total_size == 20 * MiB);
    } else {
      CHECK(segment.expandable);
    }
  }
  allocator.deallocate(in_pool);
  allocator.deallocate(outside);
}

TEST_CASE("restore_pool puts a pool's blocks back as checkpoint_pool saw them") {
  auto device = simulated();
  CachingAllocator allocator(device);
  allocator.begin_allocate_to_pool(kGraphPool, every_stream());
  void* x = allocator.allocate(3 * MiB);
  void* y = allocator.allocate(3 * MiB);
  allocator.deallocate(x);
  // Given the checkpoint [x: free 3 MiB][y: allocated 3 MiB][free 14 MiB]:
  const PoolCheckpoint checkpoint = allocator.checkpoint_pool(kGraphPool);
  REQUIRE(checkpoint.segments.size() == 1);
  REQUIRE(checkpoint.segments[0].blocks.size() == 3);
  // When the pool moves on (z takes x's place, y is freed) and is restored:
  void* z = allocator.allocate(3 * MiB);
  CHECK(z == x);
  allocator.deallocate(y);
  allocator.end_allocate_to_pool(kGraphPool);
  const PoolRestore restored = allocator.restore_pool(checkpoint);
  // Then z was freed and y allocated again, and the layout is the checkpoint's.
  REQUIRE(restored.freed.size() == 1);
  CHECK(restored.freed[0] == z);
  REQUIRE(restored.allocated.size() == 1);
  CHECK(restored.allocated[0] == y);
  CHECK(allocator.checkpoint_pool(kGraphPool).segments[0].blocks.size() == 3);
  const auto blocks = allocator.checkpoint_pool(kGraphPool).segments[0].blocks;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    CHECK(blocks[i].ptr == checkpoint.segments[0].blocks[i].ptr);
    CHECK(blocks[i].size == checkpoint.segments[0].blocks[i].size);
    CHECK(blocks[i].allocated == checkpoint.segments[0].blocks[i].allocated);
  }
  const MemoryStats stats = allocator.stats();
  CHECK(stats.allocated_bytes[stat_all].current == static_cast<std::int64_t>(3 * MiB));
  CHECK(stats.requested_bytes[stat_all].current == static_cast<std::int64_t>(3 * MiB));
  CHECK(stats.allocation[stat_all].current == 1);
  CHECK(stats.inactive_split[stat_all].current == 2);
  // The block allocated by the restore is freed like any other.
  CHECK(allocator.deallocate(y) == FreeStatus::ok);
  CHECK(allocator.memory_allocated() == 0);
  CHECK_THROWS_AS(allocator.checkpoint_pool(kOtherPool), InvalidArgument);
}
