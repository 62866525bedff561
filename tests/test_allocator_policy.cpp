// The size, pool, reuse, split and merge rules of PyTorch's caching allocator.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include "allocator_support.hpp"

using namespace cachealloc;
using namespace test_support;

TEST_CASE("sizes below 512 B round up to 512") {
  CachingAllocator allocator(test_device());
  void* p = allocator.allocate(1);
  CHECK(allocator.memory_allocated() == 512);
  CHECK(allocator.stats().requested_bytes[stat_all].current == 1);
  allocator.deallocate(p);
}

TEST_CASE("sizes round up to a multiple of 512") {
  CachingAllocator allocator(test_device());
  void* p = allocator.allocate(513);
  CHECK(allocator.memory_allocated() == 1024);
  allocator.deallocate(p);
  void* q = allocator.allocate(4 * KiB);
  CHECK(allocator.memory_allocated() == 4 * KiB);
  allocator.deallocate(q);
}

TEST_CASE("roundup_power2_divisions rounds to the next of N steps between powers of two") {
  CachingAllocator allocator(test_device(), parse_config("roundup_power2_divisions:4"));
  // 1.1 MiB lies in [1 MiB, 2 MiB): steps of 256 KiB, so 1.25 MiB.
  void* p = allocator.allocate(MiB + 100 * KiB);
  CHECK(allocator.memory_allocated() == MiB + 256 * KiB);
  allocator.deallocate(p);
  // A power of two stays as it is.
  void* q = allocator.allocate(4 * MiB);
  CHECK(allocator.memory_allocated() == 4 * MiB);
  allocator.deallocate(q);
  // Below 512 x divisions the plain 512-byte rule applies.
  void* r = allocator.allocate(1500);
  CHECK(allocator.memory_allocated() == 1536);
  allocator.deallocate(r);
}

TEST_CASE("roundup_power2_divisions per interval uses each interval's own divisions") {
  const auto config = parse_config("roundup_power2_divisions:[1:2,>:8]");
  CHECK(roundup_divisions_for(config, MiB + 1) == 2);
  CHECK(roundup_divisions_for(config, 300 * MiB) == 8);
  CachingAllocator allocator(test_device(), config);
  void* p = allocator.allocate(MiB + 100 * KiB);  // 2 steps in [1, 2) MiB -> 1.5 MiB
  CHECK(allocator.memory_allocated() == MiB + 512 * KiB);
  allocator.deallocate(p);
}

TEST_CASE("a request of 1 MiB goes to the small pool in a 2 MiB segment") {
  CachingAllocator allocator(test_device());
  void* p = allocator.allocate(MiB);
  const auto stats = allocator.stats();
  CHECK(stats.allocated_bytes[stat_small_pool].current == static_cast<std::int64_t>(MiB));
  CHECK(stats.reserved_bytes[stat_small_pool].current == static_cast<std::int64_t>(2 * MiB));
  CHECK(stats.segment[stat_large_pool].current == 0);
  allocator.deallocate(p);
}

TEST_CASE("a request of 1 MiB + 1 goes to the large pool in a 20 MiB segment") {
  CachingAllocator allocator(test_device());
  void* p = allocator.allocate(MiB + 1);
  const auto stats = allocator.stats();
  CHECK(stats.allocated_bytes[stat_large_pool].current == static_cast<std::int64_t>(MiB + 512));
  CHECK(stats.reserved_bytes[stat_large_pool].current == static_cast<std::int64_t>(20 * MiB));
  CHECK(stats.segment[stat_small_pool].current == 0);
  allocator.deallocate(p);
}

TEST_CASE("requests of 10 MiB and more get segments rounded up to 2 MiB") {
  CachingAllocator allocator(test_device());
  void* a = allocator.allocate(10 * MiB);
  CHECK(allocator.memory_reserved() == 10 * MiB);
  void* b = allocator.allocate(10 * MiB + 1);
  CHECK(allocator.memory_reserved() == 10 * MiB + 12 * MiB);
  allocator.deallocate(a);
  allocator.deallocate(b);
}

TEST_CASE("requests just under 10 MiB still get a 20 MiB segment") {
  CachingAllocator allocator(test_device());
  void* p = allocator.allocate(10 * MiB - 512);
  CHECK(allocator.memory_reserved() == 20 * MiB);
  allocator.deallocate(p);
}

TEST_CASE("small requests are carved out of one 2 MiB segment") {
  CachingAllocator allocator(test_device());
  void* a = allocator.allocate(512 * KiB);
  void* b = allocator.allocate(512 * KiB);
  void* c = allocator.allocate(512 * KiB);
  CHECK(allocator.memory_reserved() == 2 * MiB);
  CHECK(address(b) == address(a) + 512 * KiB);
  CHECK(address(c) == address(b) + 512 * KiB);
  CHECK(allocator.stats().inactive_split_bytes[stat_all].current == static_cast<std::int64_t>(512 * KiB));
  for (void* p : {a, b, c}) allocator.deallocate(p);
}

TEST_CASE("a freed block is reused for a request of the same size") {
  CachingAllocator allocator(test_device());
  void* a = allocator.allocate(3 * MiB);
  allocator.deallocate(a);
  void* b = allocator.allocate(3 * MiB);
  CHECK(b == a);
  CHECK(allocator.stats().num_device_alloc == 1);
  allocator.deallocate(b);
}

TEST_CASE("best fit takes the smallest cached block that fits") {
  CachingAllocator allocator(test_device());
  // Three separate large segments of 12, 16 and 14 MiB.
  void* a = allocator.allocate(12 * MiB);
  void* b = allocator.allocate(16 * MiB);
  void* c = allocator.allocate(14 * MiB);
  for (void* p : {a, b, c}) allocator.deallocate(p);
  void* d = allocator.allocate(13 * MiB);
  CHECK(d == c);  // 14 MiB is the smallest block >= 13 MiB
  allocator.deallocate(d);
}

TEST_CASE("among equal-sized cached blocks best fit takes the lowest address") {
  CachingAllocator allocator(test_device());
  void* a = allocator.allocate(12 * MiB);
  void* b = allocator.allocate(12 * MiB);
  allocator.deallocate(a);
  allocator.deallocate(b);
  void* c = allocator.allocate(12 * MiB);
  CHECK(address(c) == std::min(address(a), address(b)));
  allocator.deallocate(c);
}

TEST_CASE("the large pool splits a block when more than 1 MiB would remain") {
  CachingAllocator allocator(test_device());
  void* a = allocator.allocate(6 * MiB);  // 20 MiB segment, 14 MiB remain
  CHECK(allocator.memory_allocated() == 6 * MiB);
  CHECK(allocator.stats().inactive_split_bytes[stat_all].current == static_cast<std::int64_t>(14 * MiB));
  void* b = allocator.allocate(6 * MiB);
  CHECK(address(b) == address(a) + 6 * MiB);
  allocator.deallocate(a);
  allocator.deallocate(b);
}

TEST_CASE("the large pool hands out the whole block when 1 MiB or less would remain") {
  CachingAllocator allocator(test_device());
  void* a = allocator.allocate(12 * MiB);
  allocator.deallocate(a);
  void* b = allocator.allocate(11 * MiB);  // 1 MiB would remain: not split
  CHECK(b == a);
  CHECK(allocator.memory_allocated() == 12 * MiB);
  CHECK(allocator.stats().requested_bytes[stat_all].current == static_cast<std::int64_t>(11 * MiB));
  allocator.deallocate(b);
}

TEST_CASE("the small pool splits whenever at least 512 B remain") {
  CachingAllocator allocator(test_device());
  void* a = allocator.allocate(MiB);
  void* b = allocator.allocate(MiB - 512);  // leaves exactly 512 B: still split
  CHECK(allocator.stats().inactive_split_bytes[stat_all].current == 512);
  CHECK(allocator.layout().at(0).blocks.size() == 3);
  allocator.deallocate(a);
  allocator.deallocate(b);
}

TEST_CASE("freeing a block merges it with free neighbours on both sides") {
  CachingAllocator allocator(test_device());
  void* a = allocator.allocate(4 * MiB);
  void* b = allocator.allocate(4 * MiB);
  void* c = allocator.allocate(4 * MiB);
  allocator.deallocate(a);
  allocator.deallocate(c);  // c merges with the 8 MiB tail
  CHECK(allocator.stats().inactive_split[stat_all].current == 2);
  allocator.deallocate(b);  // b merges with a and with c's block: one whole segment
  const auto layout = allocator.layout();
  REQUIRE(layout.size() == 1);
  REQUIRE(layout[0].blocks.size() == 1);
  CHECK(layout[0].blocks[0].size == 20 * MiB);
  CHECK(allocator.stats().inactive_split[stat_all].current == 0);
  CHECK(allocator.stats().inactive_split_bytes[stat_all].current == 0);
}

TEST_CASE("max_split_size: oversize blocks are never split") {
  CachingAllocator allocator(test_device(), parse_config("max_split_size_mb:64"));
  void* a = allocator.allocate(100 * MiB);
  allocator.deallocate(a);
  void* b = allocator.allocate(90 * MiB);  // within 20 MiB of 100 MiB: reuses the whole block
  CHECK(b == a);
  CHECK(allocator.memory_allocated() == 100 * MiB);
  CHECK(allocator.stats().oversize_allocations.current == 1);
  allocator.deallocate(b);
}

TEST_CASE("max_split_size: an oversize block serves only requests within 20 MiB of its size") {
  CachingAllocator allocator(test_device(), parse_config("max_split_size_mb:64"));
  void* a = allocator.allocate(100 * MiB);
  allocator.deallocate(a);
  void* b = allocator.allocate(70 * MiB);  // 100 >= 70 + 20: a new segment
  CHECK(b != a);
  CHECK(allocator.memory_reserved() == 170 * MiB);
  allocator.deallocate(b);
}

TEST_CASE("max_split_size: a request below it never gets an oversize block") {
  CachingAllocator allocator(test_device(), parse_config("max_split_size_mb:64"));
  void* a = allocator.allocate(80 * MiB);
  allocator.deallocate(a);
  void* b = allocator.allocate(30 * MiB);
  CHECK(b != a);
  CHECK(allocator.stats().oversize_segments.current == 1);
  allocator.deallocate(b);
}

TEST_CASE("max_non_split_rounding_mb widens the oversize reuse window") {
  CachingAllocator allocator(test_device(), parse_config("max_split_size_mb:64,max_non_split_rounding_mb:40"));
  void* a = allocator.allocate(100 * MiB);
  allocator.deallocate(a);
  void* b = allocator.allocate(70 * MiB);  // 100 < 70 + 40
  CHECK(b == a);
  allocator.deallocate(b);
}

TEST_CASE("empty_cache releases fully free segments and keeps split ones") {
  CachingAllocator allocator(test_device());
  void* a = allocator.allocate(4 * MiB);  // 20 MiB segment, stays split by a
  void* b = allocator.allocate(30 * MiB); // its own segment
  allocator.deallocate(b);
  CHECK(allocator.memory_reserved() == 50 * MiB);
  allocator.empty_cache();
  CHECK(allocator.memory_reserved() == 20 * MiB);
  CHECK(allocator.stats().num_device_free == 1);
  allocator.deallocate(a);
  allocator.empty_cache();
  CHECK(allocator.memory_reserved() == 0);
  CHECK(allocator.stats().segment[stat_all].current == 0);
}

TEST_CASE("stats track current and peak, and reset_peak_stats lowers peaks to current") {
  CachingAllocator allocator(test_device());
  void* a = allocator.allocate(8 * MiB);
  void* b = allocator.allocate(8 * MiB);
  allocator.deallocate(b);
  CHECK(allocator.memory_allocated() == 8 * MiB);
  CHECK(allocator.max_memory_allocated() == 16 * MiB);
  allocator.reset_peak_stats();
  CHECK(allocator.max_memory_allocated() == 8 * MiB);
  CHECK(allocator.max_memory_reserved() == 20 * MiB);
  const auto map = allocator.memory_stats();
  CHECK(map.at("allocated_bytes.all.current") == static_cast<std::int64_t>(8 * MiB));
  CHECK(map.at("allocation.all.allocated") == 2);
  CHECK(map.at("allocation.all.freed") == 1);
  CHECK(map.at("segment.large_pool.current") == 1);
  CHECK(map.count("inactive_split_bytes.small_pool.peak") == 1);
  CHECK(map.count("requested_bytes.all.current") == 1);
  CHECK(map.at("num_device_alloc") == 1);
  allocator.deallocate(a);
  CHECK(allocator.memory_summary().find("Allocated memory") != std::string::npos);
}

TEST_CASE("the seed example's four steps match PyTorch's figures") {
  CachingAllocator allocator(test_device());
  void* small = allocator.allocate(4000000);
  CHECK(allocator.memory_allocated() == 4000256);
  CHECK(allocator.memory_reserved() == 20 * MiB);
  void* big = allocator.allocate(100000000);
  CHECK(allocator.memory_reserved() == 116 * MiB);
  allocator.deallocate(big);
  CHECK(allocator.memory_reserved() == 116 * MiB);
  allocator.empty_cache();
  CHECK(allocator.memory_reserved() == 20 * MiB);
  CHECK(allocator.memory_allocated() == 4000256);
  allocator.deallocate(small);
}

TEST_CASE("largest_free_block is the layout's largest inactive block, pending frees and other streams' blocks included") {
  // Given blocks split out of small and large segments on two streams, some
  // freed, one freed while used on another stream (pending, so not free),
  auto device = test_device();
  CachingAllocator allocator(device);
  const Stream side = device->create_stream();
  CHECK(allocator.largest_free_block() == 0);
  void* a = allocator.allocate(4 * MiB);
  void* b = allocator.allocate(6 * MiB);
  void* c = allocator.allocate(3 * MiB, side);
  void* d = allocator.allocate(100 * KiB);
  void* e = allocator.allocate(200 * KiB);
  allocator.deallocate(a);
  allocator.deallocate(d);
  allocator.record_stream(b, side);
  allocator.deallocate(b);
  auto largest_inactive = [&] {
    std::uint64_t largest = 0;
    for (const auto& segment : allocator.layout())
      for (const auto& block : segment.blocks)
        if (block.state == layout::BlockState::inactive) largest = std::max(largest, block.size);
    return largest;
  };
  // then it equals the layout's largest free block, before and after the pending free completes.
  CHECK(largest_inactive() > 0);
  CHECK(allocator.largest_free_block() == largest_inactive());
  device->synchronize();
  allocator.deallocate(e);
  CHECK(allocator.largest_free_block() == largest_inactive());
  allocator.deallocate(c);
  CHECK(allocator.largest_free_block() == largest_inactive());
}

namespace {
// PyTorch's best fit found the slow way, from the layout: the smallest free
// small-pool block that holds `size`, the lowest address among equal sizes;
// 0 when none does (a new segment). One stream only.
std::uint64_t brute_force_small_best_fit(const CachingAllocator& allocator, std::size_t size) {
  std::uint64_t best_size = 0, best_address = 0;
  for (const auto& segment : allocator.layout()) {
    if (segment.large_pool) continue;
    for (const auto& block : segment.blocks) {
      if (block.state != layout::BlockState::inactive || block.size < size) continue;
      if (best_size == 0 || block.size < best_size || (block.size == best_size && block.address < best_address)) {
        best_size = block.size;
        best_address = block.address;
      }
    }
  }
  return best_address;
}

std::uint64_t largest_inactive_block(const CachingAllocator& allocator) {
  std::uint64_t largest = 0;
  for (const auto& segment : allocator.layout())
    for (const auto& block : segment.blocks)
      if (block.state == layout::BlockState::inactive) largest = std::max(largest, block.size);
  return largest;
}
}  // namespace

TEST_CASE("small-pool best fit takes the block a brute-force (size, address) search of the layout finds, from 512 B to 2 MiB") {
  for (const char* conf : {"", "max_split_size_mb:21"}) {
    CAPTURE(conf);
    CachingAllocator allocator(test_device(), parse_config(conf));
    // Given two wholly free 2 MiB segments (the last bin), and a segment
    // with 512 B holes at three addresses (the first bin) and a 1 MiB + 512 B hole,
    std::vector<void*> whole;
    for (int i = 0; i < 4; ++i) whole.push_back(allocator.allocate(1 * MiB));
    std::vector<void*> carved;
    for (int i = 0; i < 7; ++i) carved.push_back(allocator.allocate(512));
    carved.push_back(allocator.allocate(1 * MiB));
    for (int i = 0; i < 2; ++i) carved.push_back(allocator.allocate(512));
    for (void* p : whole) allocator.deallocate(p);
    for (int i : {1, 3, 5, 7, 8}) allocator.deallocate(carved[static_cast<std::size_t>(i)]);
    // when 512 B, 1 MiB and 1 MiB are requested, then each gets the brute-force best fit:
    // the lowest 512 B hole, the 1 MiB + 512 B hole, then the lower whole segment.
    std::vector<void*> taken;
    for (std::size_t size : {std::size_t{512}, 1 * MiB, 1 * MiB}) {
      CAPTURE(size);
      const std::uint64_t expected = brute_force_small_best_fit(allocator, size);
      REQUIRE(expected != 0);
      taken.push_back(allocator.allocate(size));
      CHECK(address(taken.back()) == expected);
    }
    CHECK(taken[0] == carved[1]);
    CHECK(taken[1] == carved[7]);
    CHECK(address(taken[2]) == std::min(address(whole[0]), address(whole[2])));
    for (void* p : taken) allocator.deallocate(p);
    for (int i : {0, 2, 4, 6, 9}) allocator.deallocate(carved[static_cast<std::size_t>(i)]);

    // Given many free blocks of many sizes at many addresses,
    std::mt19937_64 rng(19);
    auto draw = [&rng]() -> std::size_t {
      switch (rng() % 5) {
        case 0: return 512;
        case 1: return 512 * (1 + rng() % 16);
        case 2: return 512 * (1 + rng() % 256);
        case 3: return 512 * (1 + rng() % 2048);
        default: return 1 * MiB - 512 * (rng() % 3);
      }
    };
    std::vector<void*> live;
    for (int i = 0; i < 400; ++i) live.push_back(allocator.allocate(draw()));
    for (std::size_t i = 0; i < live.size(); i += 2) allocator.deallocate(live[i]);
    std::erase_if(live, [&, i = std::size_t{0}](void*) mutable { return i++ % 2 == 0; });
    // when random requests and frees follow, then every request gets the
    // brute-force best fit (or a new segment when no free block holds it),
    // and largest_free_block is the layout's largest free block.
    std::size_t mismatches = 0, fits = 0;
    for (int step = 0; step < 1500; ++step) {
      const std::size_t size = draw();
      const std::uint64_t expected = brute_force_small_best_fit(allocator, size);
      const std::size_t reserved = allocator.memory_reserved();
      void* p = allocator.allocate(size);
      if (expected != 0) {
        ++fits;
        if (address(p) != expected) ++mismatches;
        CHECK(allocator.memory_reserved() == reserved);
      } else {
        CHECK(allocator.memory_reserved() == reserved + 2 * MiB);
      }
      live.push_back(p);
      for (int frees = static_cast<int>(rng() % 3); frees > 0 && !live.empty(); --frees) {
        const std::size_t victim = rng() % live.size();
        allocator.deallocate(live[victim]);
        live[victim] = live.back();
        live.pop_back();
      }
      if (step % 100 == 0) CHECK(allocator.largest_free_block() == largest_inactive_block(allocator));
    }
    CHECK(mismatches == 0);
    CHECK(fits > 1000);
    // and empty_cache still finds and releases every wholly free segment.
    for (std::size_t i = 0; i < live.size(); i += 2) allocator.deallocate(live[i]);
    allocator.empty_cache();
    for (const auto& segment : allocator.layout()) CHECK(segment.blocks.size() > 1);
    for (std::size_t i = 1; i < live.size(); i += 2) allocator.deallocate(live[i]);
    allocator.empty_cache();
    CHECK(allocator.memory_reserved() == 0);
  }
}
