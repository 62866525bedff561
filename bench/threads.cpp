// Aggregate cost of an alloc+free pair when T threads work at once, each on
// its own stream (the case where one global lock serializes PyTorch).
//
//   bench_threads [threads=16] [pairs per thread=200000] [history: off|none|native]
//
// Runs on the device CACHEALLOC_DEVICE selects; the cached path never calls
// the device, so the figure is the allocator's own.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cachealloc/history.hpp"

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 16;
  const long pairs = argc > 2 ? std::atol(argv[2]) : 200'000;
  const std::string history = argc > 3 ? argv[3] : "off";
  if (threads < 1 || pairs < 1 || (history != "off" && history != "none" && history != "native")) {
    std::fprintf(stderr, "usage: bench_threads [threads] [pairs per thread] [off|none|native]\n");
    return 2;
  }
  auto device = cachealloc::make_device_from_environment();
  cachealloc::CachingAllocator allocator(device);
  std::unique_ptr<cachealloc::HistoryRecorder> recorder;
  if (history != "off") {
    cachealloc::HistoryOptions options;
    options.stacks = history == "native" ? cachealloc::StackCapture::native : cachealloc::StackCapture::none;
    recorder = std::make_unique<cachealloc::HistoryRecorder>(allocator, options);
  }
  std::vector<cachealloc::Stream> streams;
  for (int t = 0; t < threads; ++t) streams.push_back(device->create_stream());
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      const cachealloc::Stream stream = streams[static_cast<std::size_t>(t)];
      allocator.deallocate(allocator.allocate(4096, stream));  // warm: the segment exists
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      for (long i = 0; i < pairs; ++i) {
        void* p = allocator.allocate(4096, stream);
        asm volatile("" : : "r"(p) : "memory");
        allocator.deallocate(p);
      }
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  go.store(true);
  for (auto& w : workers) w.join();
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  const double total = static_cast<double>(pairs) * threads;
  std::printf("cachealloc %s: %d threads x %ld pairs (4 KiB, own stream each, history %s): %.1f ns per pair in aggregate, %.1f ns per pair per thread\n",
              device->backend(), threads, pairs, history.c_str(), ns / total, ns / static_cast<double>(pairs));
  return 0;
}
