// Randomized sequences over several streams and threads, with the
// invariants checked after every step.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>
#include <thread>

#include "allocator_support.hpp"

using namespace cachealloc;
using namespace test_support;

namespace {

std::size_t random_size(std::mt19937_64& rng) {
  const double r = std::uniform_real_distribution<double>(0, 1)(rng);
  if (r < 0.5) return std::uniform_int_distribution<std::size_t>(1, MiB)(rng);
  if (r < 0.8) return std::uniform_int_distribution<std::size_t>(MiB + 1, 10 * MiB)(rng);
  return std::uniform_int_distribution<std::size_t>(10 * MiB, 64 * MiB)(rng);
}

void check_stat_invariants(const MemoryStats& s) {
  for (std::size_t t = 0; t < kStatTypes; ++t) {
    CHECK(s.allocated_bytes[t].current <= s.active_bytes[t].current);
    CHECK(s.active_bytes[t].current <= s.reserved_bytes[t].current);
    CHECK(s.requested_bytes[t].current <= s.active_bytes[t].current);
    for (const StatArray* array : {&s.allocated_bytes, &s.reserved_bytes, &s.active_bytes, &s.requested_bytes,
                                   &s.inactive_split_bytes, &s.allocation, &s.segment})
      CHECK((*array)[t].current <= (*array)[t].peak);
    CHECK(s.allocated_bytes[t].current >= 0);
  }
  CHECK(s.allocated_bytes[stat_all].current ==
        s.allocated_bytes[stat_small_pool].current + s.allocated_bytes[stat_large_pool].current);
  CHECK(s.reserved_bytes[stat_all].current ==
        s.reserved_bytes[stat_small_pool].current + s.reserved_bytes[stat_large_pool].current);
}

// Blocks tile their segments, no two live blocks overlap, and the layout adds
// up to the stats.
void check_layout(const CachingAllocator& allocator) {
  const auto layout = allocator.layout();
  const auto stats = allocator.stats();
  std::uint64_t reserved = 0, allocated = 0, inactive_split = 0;
  std::uint64_t previous_end = 0;
  for (const auto& segment : layout) {
    CHECK(segment.address >= previous_end);
    previous_end = segment.address + segment.total_size;
    reserved += segment.total_size;
    std::uint64_t cursor = segment.address;
    for (const auto& block : segment.blocks) {
      CHECK(block.address == cursor);
      cursor += block.size;
      if (block.state == layout::BlockState::active_allocated) allocated += block.size;
      // Inactive split bytes leave out expandable segments, as in PyTorch.
      if (block.state == layout::BlockState::inactive && segment.blocks.size() > 1 && !segment.expandable)
        inactive_split += block.size;
    }
    CHECK(cursor == segment.address + segment.total_size);
  }
  CHECK(reserved == static_cast<std::uint64_t>(stats.reserved_bytes[stat_all].current));
  CHECK(allocated == static_cast<std::uint64_t>(stats.allocated_bytes[stat_all].current));
  CHECK(inactive_split == static_cast<std::uint64_t>(stats.inactive_split_bytes[stat_all].current));
}

}  // namespace

TEST_CASE("random single-thread sequences over three streams keep every invariant after every step") {
  auto device = simulated(150109880320ull, /*events_immediate=*/false);
  for (const char* conf : {"", "max_split_size_mb:64", "roundup_power2_divisions:4",
                           "garbage_collection_threshold:0.7,max_split_size_mb:48", "expandable_segments:True",
                           "expandable_segments:True,garbage_collection_threshold:0.7,max_split_size_mb:48"}) {
    const std::string name = conf;
    CAPTURE(name);
    CachingAllocator allocator(device, parse_config(conf));
    if (std::string(conf).find("garbage") != std::string::npos) allocator.set_memory_fraction(0.004);  // ~560 MiB
    std::mt19937_64 rng(42);
    const Stream streams[] = {Stream{}, device->create_stream(), device->create_stream()};
    std::vector<std::pair<void*, Stream>> live;
    for (int step = 0; step < 3000; ++step) {
      const double r = std::uniform_real_distribution<double>(0, 1)(rng);
      if (r < 0.01) {
        allocator.empty_cache();
      } else if (r < 0.03) {
        device->synchronize();
      } else if (!live.empty() && (r < 0.5 || live.size() > 40)) {
        const std::size_t i = std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng);
        if (std::uniform_int_distribution<int>(0, 9)(rng) == 0)
          allocator.record_stream(live[i].first, streams[std::uniform_int_distribution<int>(0, 2)(rng)]);
        CHECK(allocator.deallocate(live[i].first) == FreeStatus::ok);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        const Stream stream = streams[std::uniform_int_distribution<int>(0, 2)(rng)];
        try {
          live.emplace_back(allocator.allocate(random_size(rng), stream), stream);
        } catch (const OutOfMemoryError&) {
        }
      }
      check_stat_invariants(allocator.stats());
      if (step % 10 == 0) check_layout(allocator);
    }
    for (auto& [ptr, stream] : live) allocator.deallocate(ptr);
    device->synchronize();
    allocator.empty_cache();
    const auto s = allocator.stats();
    CHECK(s.allocated_bytes[stat_all].current == 0);
    CHECK(s.active_bytes[stat_all].current == 0);
    CHECK(s.requested_bytes[stat_all].current == 0);
    CHECK(s.inactive_split_bytes[stat_all].current == 0);
    CHECK(s.reserved_bytes[stat_all].current == 0);
    CHECK(s.allocation[stat_all].allocated == s.allocation[stat_all].freed);
    // Expandable segments map and unmap in differently sized calls; there
    // reserved memory returning to 0 is the balance.
    if (std::string(conf).find("expandable") == std::string::npos) CHECK(s.num_device_alloc == s.num_device_free);
  }
}

TEST_CASE("threads on their own streams allocate concurrently without overlap or lost counts") {
  auto device = test_device();
  CachingAllocator allocator(device);
  constexpr int kThreads = 4;
  constexpr int kSteps = 4000;
  std::vector<Stream> streams;
  for (int t = 0; t < kThreads; ++t) streams.push_back(t == 0 ? Stream{} : device->create_stream());
  std::vector<std::vector<std::pair<std::uintptr_t, std::size_t>>> held(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 7);
      std::vector<std::pair<void*, std::size_t>> live;
      for (int step = 0; step < kSteps; ++step) {
        if (!live.empty() && (rng() % 2 == 0 || live.size() > 30)) {
          const std::size_t i = rng() % live.size();
          allocator.deallocate(live[i].first);
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          const std::size_t size = random_size(rng) / 4 + 1;
          live.emplace_back(allocator.allocate(size, streams[static_cast<std::size_t>(t)]), size);
        }
      }
      for (auto& [ptr, size] : live) held[static_cast<std::size_t>(t)].emplace_back(reinterpret_cast<std::uintptr_t>(ptr), size);
    });
  }
  for (auto& thread : threads) thread.join();
  // Whatever the threads still hold must not overlap.
  std::vector<std::pair<std::uintptr_t, std::size_t>> all;
  for (auto& h : held) all.insert(all.end(), h.begin(), h.end());
  std::sort(all.begin(), all.end());
  for (std::size_t i = 1; i < all.size(); ++i) CHECK(all[i - 1].first + all[i - 1].second <= all[i].first);
  check_stat_invariants(allocator.stats());
  check_layout(allocator);
  CHECK(allocator.stats().allocation[stat_all].current == static_cast<std::int64_t>(all.size()));
  for (auto& [ptr, size] : all) allocator.deallocate(reinterpret_cast<void*>(ptr));
  allocator.empty_cache();
  CHECK(allocator.memory_reserved() == 0);
  for (int t = 1; t < kThreads; ++t) device->destroy_stream(streams[static_cast<std::size_t>(t)]);
}

TEST_CASE("threads sharing one stream allocate and free concurrently without corruption") {
  CachingAllocator allocator(test_device());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t));
      for (int step = 0; step < 3000; ++step) {
        void* p = allocator.allocate(random_size(rng) / 8 + 1);
        allocator.deallocate(p);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  const auto s = allocator.stats();
  CHECK(s.allocation[stat_all].current == 0);
  CHECK(s.allocation[stat_all].allocated == 12000);
  check_layout(allocator);
}
