// How long a dump takes with many distinct native stacks,
// symbolization included.
//
//   bench_dump_time [events=1000000] [distinct stacks=10000] [out: kept when given]
//
// Records `events` events (4 KiB alloc+free pairs: split, alloc,
// free_requested, free_completed, merge) with native stacks, the allocations
// made from `distinct` different call paths: a 14-level descent through two
// call sites per level, the path picked by the bits of the pair's number,
// so every path has its own return addresses. Then times dump_snapshot()
// (the cut, the stack table, symbolizing every distinct frame once, encoding
// and writing the file), twice: the second dump reuses the symbols the first
// resolved. PyTorch's _dump_snapshot for the same number of events:
// bench/torch_dump_time.py.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "args.hpp"
#include "cachealloc/history.hpp"

namespace {

constexpr int kLevels = 14;  // 2^14 = 16,384 paths

struct Context {
  cachealloc::CachingAllocator* allocator;
  unsigned path;
};

__attribute__((noinline)) void leaf(Context& c) {
  void* p = c.allocator->allocate(4096);
  asm volatile("" : : "r"(p) : "memory");
  c.allocator->deallocate(p);
}

void descend(Context& c, int level);
__attribute__((noinline)) void left(Context& c, int level) {
  descend(c, level + 1);
  asm volatile("");  // keeps the call from becoming a tail call: its return address stays on the stack
}
__attribute__((noinline)) void right(Context& c, int level) {
  descend(c, level + 1);
  asm volatile("");
}
__attribute__((noinline)) void descend(Context& c, int level) {
  if (level == kLevels) {
    leaf(c);
  } else if ((c.path >> level) & 1u) {
    right(c, level);
  } else {
    left(c, level);
  }
  asm volatile("");
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  const cachealloc::bench::Args args(
      argc, argv, "[events >= 10] [distinct stacks, 1.." + std::to_string(1L << kLevels) + "] [out]", 3);
  const long events = args.count<long>(1, 1'000'000, 10, 1'000'000'000, "events");
  const long distinct = args.count<long>(2, 10'000, 1, 1L << kLevels, "distinct stacks");
  const std::filesystem::path out = args.has(3) ? args[3] : "/tmp/cachealloc-dump.bin";
  auto device = cachealloc::make_device_from_environment();
  cachealloc::CachingAllocator allocator(device);
  cachealloc::HistoryOptions options;
  options.stacks = cachealloc::StackCapture::native;
  options.max_entries = static_cast<std::uint64_t>(events) + 1000;
  cachealloc::HistoryRecorder recorder(allocator, options);
  Context context{&allocator, 0};
  const auto record_start = std::chrono::steady_clock::now();
  long pairs = 0;
  while (recorder.recorded_events() < static_cast<std::uint64_t>(events)) {
    for (int i = 0; i < 100; ++i, ++pairs) {
      context.path = static_cast<unsigned>(pairs % distinct);
      descend(context, 0);
    }
  }
  const double recording = seconds_since(record_start);
  const std::uint64_t recorded = recorder.recorded_events();
  const auto first_start = std::chrono::steady_clock::now();
  if (!recorder.dump_snapshot(out)) return 1;
  const double first = seconds_since(first_start);
  const auto second_start = std::chrono::steady_clock::now();
  if (!recorder.dump_snapshot(out)) return 1;
  const double second = seconds_since(second_start);
  std::printf("cachealloc %s: %llu events (%ld pairs from %ld distinct call paths, native stacks) recorded in %.2f s; "
              "dump_snapshot: %.3f s the first time (symbolization included), %.3f s the second; file %.1f MB\n",
              device->backend(), static_cast<unsigned long long>(recorded), pairs, distinct, recording, first, second,
              static_cast<double>(std::filesystem::file_size(out)) / 1e6);
  if (!args.has(3)) std::filesystem::remove(out);  // a path given: kept
  return 0;
}
