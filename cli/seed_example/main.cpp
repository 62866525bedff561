// cachealloc-seed-example: the four steps PyTorch users know, on our
// allocator. Prints the same lines PyTorch prints for
//   x = torch.empty(1000, 1000); y = torch.empty(5000, 5000); del y; empty_cache()
// on the device CACHEALLOC_DEVICE selects (auto: the GPU when there is one),
// recording its memory history into a snapshot when asked.
#include <cstdio>
#include <exception>
#include <string>

#include <vector>

#include "../common/conventions.hpp"
#include "cachealloc/history.hpp"

namespace {

void report(const char* step, const cachealloc::CachingAllocator& allocator) {
  constexpr double kMiB = 1024.0 * 1024.0;
  std::printf("%s - allocated: %.2fMB, reserved: %.2fMB\n", step,
              static_cast<double>(allocator.memory_allocated()) / kMiB,
              static_cast<double>(allocator.memory_reserved()) / kMiB);
}

}  // namespace

int main(int argc, char** argv) {
  constexpr const char* kProgram = "cachealloc-seed-example";
  CLI::App app{"Allocate 4,000,000 and 100,000,000 bytes, free the second, empty the cache; print allocated and\n"
               "reserved after each step, as PyTorch does.\n\n"
               "Examples:\n"
               "  cachealloc-seed-example\n"
               "  cachealloc-seed-example --snapshot snapshot.bin && cachealloc-analyze snapshot.bin\n"
               "Exit status: 0 done; 2 bad usage or a snapshot that cannot be written; 1 an internal error.",
               kProgram};
  std::string snapshot;
  app.add_option("--snapshot", snapshot, "record the memory history (native stacks) and dump it to this file");
  cachealloc::cli::add_version_flags(app, std::string(kProgram) + " " CACHEALLOC_VERSION);
  if (const auto stop = cachealloc::cli::parse(app, kProgram, std::vector<std::string>(argv + 1, argv + argc)))
    return *stop;
  try {
    auto device = cachealloc::make_device_from_environment();
    std::fprintf(stderr, "device: %s (%s)\n", device->name().c_str(), device->backend());
    cachealloc::CachingAllocator allocator(device, cachealloc::config_from_environment());
    cachealloc::HistoryOptions options;
    options.enabled = !snapshot.empty();
    cachealloc::HistoryRecorder history(allocator, options);
    void* small = nullptr;
    {
      cachealloc::AnnotationScope step(history, "init");
      small = allocator.allocate(1000 * 1000 * sizeof(float));
    }
    report("init", allocator);
    void* big = nullptr;
    {
      cachealloc::AnnotationScope step(history, "alloc");
      big = allocator.allocate(5000 * 5000 * sizeof(float));
    }
    report("after alloc", allocator);
    {
      cachealloc::AnnotationScope step(history, "free");
      allocator.deallocate(big);
    }
    report("after free", allocator);
    {
      cachealloc::AnnotationScope step(history, "empty_cache");
      allocator.empty_cache();
    }
    report("after empty_cache", allocator);
    if (!snapshot.empty()) {
      if (!history.dump_snapshot(snapshot)) return 2;
      std::fprintf(stderr, "snapshot: %s\n", snapshot.c_str());
    }
    allocator.deallocate(small);
  } catch (const std::exception& e) {
    // The device or the allocator refused (no GPU, out of memory): not a bug of ours.
    std::fprintf(stderr, "%s: error: %s\n", kProgram, e.what());
    return 2;
  }
  return 0;
}
