// The mixed workload (bench/mixed_workload.hpp) on our allocator:
//
//   bench_mixed [steps=1000000] [passes=5] [history: off|none|native]
//
// Runs on the device CACHEALLOC_DEVICE selects (cuda on the H200 host). The
// same requests through PyTorch's allocator: bench/torch_peer.cpp --mixed.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "args.hpp"
#include "cachealloc/history.hpp"
#include "mixed_workload.hpp"

int main(int argc, char** argv) {
  const cachealloc::bench::Args args(argc, argv, "[steps] [passes] [off|none|native]", 3);
  const long count = args.count<long>(1, 1'000'000, 1, 1'000'000'000, "steps");
  const int passes = args.count<int>(2, 5, 1, 1000, "passes");
  const std::string history = args.word(3, "off", {"off", "none", "native"}, "history");
  auto device = cachealloc::make_device_from_environment();
  cachealloc::CachingAllocator allocator(device);
  std::unique_ptr<cachealloc::HistoryRecorder> recorder;
  if (history != "off") {
    cachealloc::HistoryOptions options;
    options.stacks = history == "native" ? cachealloc::StackCapture::native : cachealloc::StackCapture::none;
    recorder = std::make_unique<cachealloc::HistoryRecorder>(allocator, options);
  }
  const cachealloc::Stream stream{};
  const auto plan = mixed_workload::steps(static_cast<std::size_t>(count));
  const double ns = mixed_workload::best_ns_per_step(
      plan, passes, [&](std::size_t bytes) { return allocator.allocate(bytes, stream); },
      [&](void* p) { allocator.deallocate(p); });
  const auto stats = allocator.memory_stats();
  std::printf("cachealloc %s: mixed workload, %zu slots, 512 B-8 MiB, %ld steps, best of %d passes (history %s): "
              "%.1f ns per free+alloc; peak reserved %lld B, device allocs %lld\n",
              device->backend(), mixed_workload::kSlots, count, passes, history.c_str(), ns,
              static_cast<long long>(stats.at("reserved_bytes.all.peak")),
              static_cast<long long>(stats.at("num_device_alloc")));
  return 0;
}
