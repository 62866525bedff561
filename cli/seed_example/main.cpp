// cachealloc-seed-example: the four steps PyTorch users know, on our
// allocator. Prints the same lines PyTorch prints for
//   x = torch.empty(1000, 1000); y = torch.empty(5000, 5000); del y; empty_cache()
// on the device CACHEALLOC_DEVICE selects (auto: the GPU when there is one),
// recording its memory history into a snapshot when asked. After the free it
// prints the chain of views from allocated to the device total.
#include <cstdio>
#include <exception>
#include <optional>
#include <string>

#include <vector>

#include "../common/conventions.hpp"
#include "cachealloc/history.hpp"
#include "cachealloc/memory_views.hpp"

namespace {

void report(const char* step, const cachealloc::CachingAllocator& allocator) {
  constexpr double kMiB = 1024.0 * 1024.0;
  std::printf("%s - allocated: %.2fMB, reserved: %.2fMB\n", step,
              static_cast<double>(allocator.memory_allocated()) / kMiB,
              static_cast<double>(allocator.memory_reserved()) / kMiB);
}

// The chain from the allocator to the device, each figure labelled with the
// tool that shows it to a PyTorch user.
void views(const char* step, cachealloc::CachingAllocator& allocator) {
  const cachealloc::MemoryViews v = cachealloc::memory_views(allocator);
  const auto mib = [](std::uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); };
  const bool nvml = v.usage.source != cachealloc::DeviceUsage::Source::unavailable;
  const auto figure = [&](bool known, std::uint64_t bytes) {
    char text[32];
    if (known) std::snprintf(text, sizeof text, "%.2f MiB", mib(bytes));
    else std::snprintf(text, sizeof text, "unknown");
    return std::string(text);
  };
  const auto line = [&](const char* what, const std::string& value, const std::string& remainder) {
    std::printf("  %-40s %14s%s%s\n", what, value.c_str(), remainder.empty() ? "" : "  = ", remainder.c_str());
  };
  const auto outside = v.outside_allocator();
  const auto others = v.outside_process();
  const auto free = v.device_free();
  std::printf("%s - from allocated to the device total:\n", step);
  line("torch.cuda.memory_allocated()", figure(true, v.allocated), "");
  line("torch.cuda.memory_reserved()", figure(true, v.reserved),
       "allocated + " + figure(true, v.cached()) + " cached in the allocator");
  line("nvidia-smi, this process (used_memory)", figure(nvml && v.usage.process_found, v.usage.process_used),
       "reserved + " + figure(outside.has_value(), outside.value_or(0)) +
           " CUDA context and other allocators in this process");
  line("nvidia-smi, the device (memory.used)", figure(nvml, v.usage.device_used),
       "this process + " + figure(others.has_value(), others.value_or(0)) + " other processes and memory no process holds");
  line("nvidia-smi, the device (memory.total)", figure(nvml, v.usage.device_total),
       "used + " + figure(free.has_value(), free.value_or(0)) + " free + " + figure(nvml, v.usage.device_reserved) +
           " reserved by the driver");
  if (!nvml) std::printf("  (nvidia-smi's figures: %s)\n", v.usage.note.c_str());
  else if (v.usage.source == cachealloc::DeviceUsage::Source::simulated)
    std::printf("  (nvidia-smi's figures: the simulated device's model of them)\n");
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
    views("after free", allocator);
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
