// expandable_segments:True — one growing segment per stream and pool.
#include <doctest/doctest.h>

#include "allocator_support.hpp"

using namespace cachealloc;
using namespace test_support;

namespace {
AllocatorConfig expandable(const std::string& extra = "") {
  return parse_config("expandable_segments:True" + (extra.empty() ? "" : "," + extra));
}
}  // namespace

TEST_CASE("expandable: a large request maps whole 20 MiB chunks and keeps the rest of the chunk cached") {
  CachingAllocator allocator(test_device(), expandable());
  void* a = allocator.allocate(30 * MiB);
  CHECK(allocator.memory_reserved() == 40 * MiB);
  CHECK(allocator.stats().num_device_alloc == 1);
  const auto layout = allocator.layout();
  REQUIRE(layout.size() == 1);
  CHECK(layout[0].expandable);
  CHECK(layout[0].total_size == 40 * MiB);
  CHECK(layout[0].blocks.size() == 2);
  // Inactive split bytes leave out expandable segments, as in PyTorch.
  CHECK(allocator.stats().inactive_split_bytes[stat_all].current == 0);
  allocator.deallocate(a);
}

TEST_CASE("expandable: the next allocation grows the same segment instead of making a new one") {
  CachingAllocator allocator(test_device(), expandable());
  void* a = allocator.allocate(30 * MiB);
  void* b = allocator.allocate(30 * MiB);
  CHECK(address(b) == address(a) + 30 * MiB);
  CHECK(allocator.memory_reserved() == 60 * MiB);
  CHECK(allocator.layout().size() == 1);
  CHECK(allocator.stats().segment[stat_all].current == 0);  // PyTorch counts no segments for these
  allocator.deallocate(a);
  allocator.deallocate(b);
}

TEST_CASE("expandable: small requests grow a separate segment in 2 MiB chunks") {
  CachingAllocator allocator(test_device(), expandable());
  void* a = allocator.allocate(MiB);
  void* b = allocator.allocate(MiB);
  void* c = allocator.allocate(MiB);
  CHECK(allocator.memory_reserved() == 4 * MiB);
  CHECK(address(c) == address(a) + 2 * MiB);
  CHECK(allocator.stats().reserved_bytes[stat_small_pool].current == static_cast<std::int64_t>(4 * MiB));
  for (void* p : {a, b, c}) allocator.deallocate(p);
}

TEST_CASE("expandable: empty_cache unmaps every free chunk and gives back an empty segment") {
  CachingAllocator allocator(test_device(), expandable());
  void* a = allocator.allocate(30 * MiB);
  void* b = allocator.allocate(30 * MiB);
  allocator.deallocate(a);
  allocator.deallocate(b);
  allocator.empty_cache();
  CHECK(allocator.memory_reserved() == 0);
  CHECK(allocator.layout().empty());
  CHECK(allocator.stats().num_device_free >= 1);
}

TEST_CASE("expandable: empty_cache unmaps only whole free chunks around live blocks") {
  CachingAllocator allocator(test_device(), expandable());
  void* a = allocator.allocate(30 * MiB);  // [0, 30) of 40 mapped
  void* b = allocator.allocate(30 * MiB);  // [30, 60) of 60 mapped
  void* c = allocator.allocate(5 * MiB);   // [60, 65) of 80 mapped
  allocator.deallocate(b);                 // free [30, 60): chunk [40, 60) is whole
  allocator.empty_cache();
  CHECK(allocator.memory_reserved() == 60 * MiB);  // 80 - the [40, 60) chunk
  const auto layout = allocator.layout();
  CHECK(layout.size() == 2);  // two mapped runs around the hole
  // When b's size is needed again, the hole is mapped again at the lowest address.
  void* d = allocator.allocate(30 * MiB);
  CHECK(d == b);
  CHECK(allocator.memory_reserved() == 80 * MiB);
  for (void* p : {a, c, d}) allocator.deallocate(p);
}

TEST_CASE("expandable: large blocks split whenever 512 B remain") {
  CachingAllocator allocator(test_device(), expandable());
  void* a = allocator.allocate(19 * MiB + 512 * KiB);
  void* b = allocator.allocate(256 * KiB + 1);  // small pool: its own segment
  void* c = allocator.allocate(MiB + 1);        // large pool: into the 0.5 MiB tail? too small: grows
  CHECK(address(c) == address(a) + 19 * MiB + 512 * KiB);
  for (void* p : {a, b, c}) allocator.deallocate(p);
}

TEST_CASE("expandable: under a memory fraction the free-cache-and-retry path unmaps cached chunks") {
  CachingAllocator allocator(test_device(), expandable());
  const auto total = allocator.device().memory_info().total;
  allocator.set_memory_fraction(static_cast<double>(100 * MiB) / static_cast<double>(total) + 1e-12);
  void* a = allocator.allocate(60 * MiB);  // 60 mapped
  void* keep = allocator.allocate(10 * MiB);  // 80 mapped (a 20 MiB chunk for 10 MiB)
  allocator.deallocate(a);
  // 80 + 20 <= 100: served from the cached 60 MiB without mapping.
  void* b = allocator.allocate(50 * MiB);
  CHECK(b == a);
  CHECK(allocator.stats().num_alloc_retries == 0);
  CHECK_THROWS_AS((void)allocator.allocate(60 * MiB), OutOfMemoryError);
  CHECK(allocator.stats().num_alloc_retries == 1);
  allocator.deallocate(b);
  allocator.deallocate(keep);
}
