// cachealloc-seed-example: the four steps PyTorch users know, on our
// allocator. Prints the same lines PyTorch prints for
//   x = torch.empty(1000, 1000); y = torch.empty(5000, 5000); del y; empty_cache()
// on the device CACHEALLOC_DEVICE selects (auto: the GPU when there is one).
#include <cstdio>
#include <exception>

#include "cachealloc/allocator.hpp"

namespace {

void report(const char* step, const cachealloc::CachingAllocator& allocator) {
  constexpr double kMiB = 1024.0 * 1024.0;
  std::printf("%s - allocated: %.2fMB, reserved: %.2fMB\n", step,
              static_cast<double>(allocator.memory_allocated()) / kMiB,
              static_cast<double>(allocator.memory_reserved()) / kMiB);
}

}  // namespace

int main() {
  try {
    auto device = cachealloc::make_device_from_environment();
    std::fprintf(stderr, "device: %s (%s)\n", device->name().c_str(), device->backend());
    cachealloc::CachingAllocator allocator(device, cachealloc::config_from_environment());
    void* small = allocator.allocate(1000 * 1000 * sizeof(float));
    report("init", allocator);
    void* big = allocator.allocate(5000 * 5000 * sizeof(float));
    report("after alloc", allocator);
    allocator.deallocate(big);
    report("after free", allocator);
    allocator.empty_cache();
    report("after empty_cache", allocator);
    allocator.deallocate(small);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
