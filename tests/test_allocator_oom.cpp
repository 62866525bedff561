// The out-of-memory path: oversize release, free-all-and-retry, the error.
#include <doctest/doctest.h>

#include "allocator_support.hpp"

using namespace cachealloc;
using namespace test_support;

namespace {
// A cap of exactly `bytes` on a device of the usual simulated size.
void cap(CachingAllocator& allocator, std::size_t bytes) {
  const auto total = allocator.device().memory_info().total;
  allocator.set_memory_fraction(static_cast<double>(bytes) / static_cast<double>(total) + 1e-12);
}
}  // namespace

TEST_CASE("memory fraction caps reserved memory and the error states the figures") {
  CachingAllocator allocator(test_device());
  cap(allocator, 100 * MiB);
  void* a = allocator.allocate(60 * MiB);
  try {
    (void)allocator.allocate(60 * MiB);
    FAIL("expected an OutOfMemoryError");
  } catch (const OutOfMemoryError& e) {
    CHECK(e.requested() == 60 * MiB);
    CHECK(e.allocated() == 60 * MiB);
    CHECK(e.reserved() == 60 * MiB);
    CHECK(e.cap() >= 100 * MiB);
    CHECK(e.cap() < 101 * MiB);
    const std::string message = e.what();
    CHECK(message.find("tried to allocate 60.00 MiB") != std::string::npos);
    CHECK(message.find("cap") != std::string::npos);
    CHECK(message.find("free") != std::string::npos);
  }
  const auto stats = allocator.stats();
  CHECK(stats.num_ooms == 1);
  CHECK(stats.num_alloc_retries == 1);
  allocator.deallocate(a);
}

TEST_CASE("when the cap is reached cached unsplit segments are released and the allocation retried") {
  CachingAllocator allocator(test_device());
  cap(allocator, 100 * MiB);
  void* a = allocator.allocate(60 * MiB);
  allocator.deallocate(a);  // 60 MiB cached
  void* b = allocator.allocate(70 * MiB);  // needs the cache released first
  CHECK(allocator.memory_reserved() == 70 * MiB);
  const auto stats = allocator.stats();
  CHECK(stats.num_alloc_retries == 1);
  CHECK(stats.num_device_free == 1);
  CHECK(stats.num_ooms == 0);
  allocator.deallocate(b);
}

TEST_CASE("with max_split_size the cached oversize block is released before anything else") {
  CachingAllocator allocator(test_device(), parse_config("max_split_size_mb:64"));
  cap(allocator, 190 * MiB);
  void* keep = allocator.allocate(30 * MiB);  // 30 MiB segment, not oversize
  void* big = allocator.allocate(100 * MiB);
  allocator.deallocate(big);                  // oversize, cached
  void* other = allocator.allocate(70 * MiB);   // 130 + 70 > 190: release the 100 MiB block
  CHECK(allocator.memory_reserved() == 100 * MiB);
  const auto stats = allocator.stats();
  CHECK(stats.num_alloc_retries == 0);  // the oversize release sufficed, no full retry
  CHECK(stats.num_device_free == 1);
  allocator.deallocate(other);
  allocator.deallocate(keep);
}

TEST_CASE("with max_split_size several cached oversize blocks are released, largest first, to cover a request") {
  CachingAllocator allocator(test_device(), parse_config("max_split_size_mb:64"));
  cap(allocator, 250 * MiB);
  void* a = allocator.allocate(80 * MiB);
  void* b = allocator.allocate(90 * MiB);
  void* keep = allocator.allocate(70 * MiB);
  allocator.deallocate(a);
  allocator.deallocate(b);
  // 240 reserved; 150 MiB more needs both cached oversize blocks (90 + 80 >= 150) released.
  void* c = allocator.allocate(150 * MiB);
  CHECK(allocator.memory_reserved() == 220 * MiB);
  CHECK(allocator.stats().num_device_free == 2);
  CHECK(allocator.stats().num_alloc_retries == 0);
  allocator.deallocate(c);
  allocator.deallocate(keep);
}

TEST_CASE("a split segment is not released by the retry path") {
  CachingAllocator allocator(test_device());
  cap(allocator, 40 * MiB);
  void* a = allocator.allocate(4 * MiB);  // 20 MiB segment, split
  CHECK_THROWS_AS((void)allocator.allocate(30 * MiB), OutOfMemoryError);
  CHECK(allocator.memory_reserved() == 20 * MiB);
  allocator.deallocate(a);
}

TEST_CASE("simulated: the device's own limit gives the same OOM sequence without a cap") {
  CachingAllocator allocator(simulated(64 * MiB));
  void* a = allocator.allocate(30 * MiB);
  allocator.deallocate(a);
  void* b = allocator.allocate(40 * MiB);  // device full: release the 30 MiB, retry
  CHECK(allocator.stats().num_alloc_retries == 1);
  CHECK_THROWS_AS((void)allocator.allocate(40 * MiB), OutOfMemoryError);
  CHECK(allocator.stats().num_ooms == 1);
  allocator.deallocate(b);
}

TEST_CASE("the OOM message suggests max_split_size_mb when reserved-but-unallocated memory is fragmented") {
  CachingAllocator allocator(test_device());
  cap(allocator, 100 * MiB);
  // Five 20 MiB segments, each with a 2 MiB allocation in it: 90 MiB free but in 18 MiB pieces.
  std::vector<void*> pins;
  std::vector<void*> fillers;
  for (int i = 0; i < 5; ++i) {
    pins.push_back(allocator.allocate(2 * MiB));
    fillers.push_back(allocator.allocate(18 * MiB));
  }
  for (void* p : fillers) allocator.deallocate(p);
  try {
    (void)allocator.allocate(19 * MiB);
    FAIL("expected an OutOfMemoryError");
  } catch (const OutOfMemoryError& e) {
    CHECK(std::string(e.what()).find("max_split_size_mb") != std::string::npos);
  }
  for (void* p : pins) allocator.deallocate(p);
}

TEST_CASE("garbage collection frees old cached blocks once reserved passes threshold x cap") {
  CachingAllocator allocator(test_device(), parse_config("garbage_collection_threshold:0.5"));
  cap(allocator, 100 * MiB);
  void* a = allocator.allocate(30 * MiB);
  void* b = allocator.allocate(24 * MiB);
  allocator.deallocate(a);
  allocator.deallocate(b);
  CHECK(allocator.memory_reserved() == 54 * MiB);
  // A miss with reserved (54) above 50: blocks at least as old as the average go.
  void* c = allocator.allocate(40 * MiB);
  CHECK(allocator.stats().num_device_free >= 1);
  CHECK(allocator.memory_reserved() <= 64 * MiB);
  CHECK(allocator.stats().num_alloc_retries == 0);
  allocator.deallocate(c);
}

TEST_CASE("garbage collection does nothing without a memory fraction") {
  CachingAllocator allocator(test_device(), parse_config("garbage_collection_threshold:0.5"));
  void* a = allocator.allocate(30 * MiB);
  allocator.deallocate(a);
  void* c = allocator.allocate(40 * MiB);
  CHECK(allocator.stats().num_device_free == 0);
  allocator.deallocate(c);
}
