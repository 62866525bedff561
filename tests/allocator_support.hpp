// Shared set-up for the allocator suites: every case runs on the device that
// CACHEALLOC_TEST_DEVICE names (simulated by default, cuda on a GPU machine).
// Cases that need the simulated device's controls (capacity, event timing)
// create one explicitly and say so in their name.
#pragma once

#include <cstdlib>
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

}  // namespace test_support
