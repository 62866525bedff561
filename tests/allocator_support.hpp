// Shared set-up for the allocator suites: every case runs on the device that
// CACHEALLOC_TEST_DEVICE names (simulated by default, cuda on a GPU machine).
// Cases that need the simulated device's controls (capacity, event timing)
// create one explicitly and say so in their name.
#pragma once

#include <cstdlib>
#include <random>
#include <memory>
#include <string>
#include <vector>

#include "cachealloc/allocator.hpp"
#include "cachealloc/errors.hpp"

namespace test_support {

inline constexpr std::size_t KiB = 1024;
inline constexpr std::size_t MiB = 1024 * 1024;

inline bool on_cuda() {
  const char* name = std::getenv("CACHEALLOC_TEST_DEVICE");
  return name && std::string(name) == "cuda";
}

inline std::shared_ptr<cachealloc::Device> test_device() {
  if (on_cuda()) return cachealloc::make_cuda_device(0);
  return cachealloc::make_simulated_device();
}

inline std::shared_ptr<cachealloc::Device> simulated(std::size_t capacity = 150109880320ull,
                                                     bool events_immediate = false) {
  cachealloc::SimulatedDeviceOptions options;
  options.capacity = capacity;
  options.events_complete_immediately = events_immediate;
  return cachealloc::make_simulated_device(options);
}

inline std::uintptr_t address(void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr); }

// Segment sizes in address order, for "which segments exist" assertions.
inline std::vector<std::size_t> segment_sizes(const cachealloc::CachingAllocator& allocator) {
  std::vector<std::size_t> sizes;
  for (const auto& segment : allocator.layout()) sizes.push_back(segment.total_size);
  return sizes;
}

// testdata/pytorch/fragmenting/workload.py through our allocator:
// step i allocates 256 MiB + 6 MiB * i, frees the previous activation and
// keeps half of it plus 2 MiB, which pins every segment. Frees everything at
// the end. Returns whether it ran out of memory. (test_what_if_replay and
// test_sweep replay it; the H200 run is the same workload in PyTorch.)
inline bool fragmenting_workload(cachealloc::CachingAllocator& allocator) {
  std::vector<void*> keepers;
  void* previous = nullptr;
  bool oom = false;
  for (std::size_t step = 0; step < 40 && !oom; ++step) {
    const std::size_t size = 256 * MiB + step * 6 * MiB;
    try {
      void* x = allocator.allocate(size);
      if (previous) allocator.deallocate(previous);
      previous = x;
      keepers.push_back(allocator.allocate(size / 2 + 2 * MiB));
    } catch (const cachealloc::OutOfMemoryError&) {
      oom = true;
    }
  }
  for (void* p : keepers) allocator.deallocate(p);
  if (previous) allocator.deallocate(previous);
  return oom;
}

// A mixed workload: sizes from 512 B to 40 MiB, two streams, frees out of
// order, empty_cache and device synchronizations; with `record_streams`,
// one block in five also used on a stream (record_stream); with
// `free_at_end`, every block still live is freed last. Deterministic for a seed.
struct MixedWorkload {
  bool record_streams = true;
  bool free_at_end = false;
};
inline void mixed_workload(cachealloc::CachingAllocator& allocator, cachealloc::Device& device, unsigned seed,
                           int operations, MixedWorkload shape = {}) {
  std::mt19937 random(seed);
  const cachealloc::Stream streams[2] = {cachealloc::Stream{}, device.create_stream()};
  std::vector<void*> live;
  for (int i = 0; i < operations; ++i) {
    const unsigned choice = random() % 10;
    if (choice < 5 || live.empty()) {
      static constexpr std::size_t sizes[] = {512, 3000, 64 * KiB, 900 * KiB, 3 * MiB, 6 * MiB, 12 * MiB, 40 * MiB};
      void* p = allocator.allocate(sizes[random() % 8] + random() % 4096, streams[random() % 2]);
      if (shape.record_streams && random() % 5 == 0) allocator.record_stream(p, streams[random() % 2]);
      live.push_back(p);
    } else if (choice < 9) {
      const std::size_t index = random() % live.size();
      allocator.deallocate(live[index]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(index));
    } else if (random() % 8 == 0) {
      allocator.empty_cache();
    } else {
      device.synchronize();
    }
  }
  if (shape.free_at_end)
    for (void* p : live) allocator.deallocate(p);
}

}  // namespace test_support
