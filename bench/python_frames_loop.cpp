// The inner loop of bench/python_frames.py: N cached 4 KiB alloc+free pairs
// through the C ABI, timed here so that no Python call sits inside the
// figure, while the Python frames of the caller stay on the thread.
#include <time.h>

#include <cstdint>

#include "cachealloc/cachealloc.h"

extern "C" __attribute__((visibility("default"))) std::uint64_t bench_pairs(std::uint64_t pairs) {
  timespec start{}, end{};
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (std::uint64_t i = 0; i < pairs; ++i) cachealloc_free(cachealloc_malloc(4096, 0), 4096, 0);
  clock_gettime(CLOCK_MONOTONIC, &end);
  return static_cast<std::uint64_t>((end.tv_sec - start.tv_sec) * 1000000000LL + (end.tv_nsec - start.tv_nsec));
}
