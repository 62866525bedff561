// Aggregate cost of an alloc+free pair when T threads work at once, each on
// its own stream (the case where one global lock serializes PyTorch).
//
//   bench_threads [threads=16] [pairs per thread=200000] [history: off|none|native|malloc] [own|shared]
//
// `shared` puts every thread on one stream, so all of them take one pool
// lock: the contended case, where waiters spin, then sleep on the lock.
//
// Runs on the device CACHEALLOC_DEVICE selects; the cached path never calls
// the device, so the figure is the allocator's own. `malloc` is the control:
// the same loop over glibc's malloc/free of 256 B, which stay in each
// thread's own cache (tcache: no lock, no atomic) and share nothing, so its per-thread cost at T
// threads against one thread is what the machine itself allows (cores that
// are hyperthreads, a shared clock budget, a VM's scheduling).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "args.hpp"
#include "cachealloc/history.hpp"

int main(int argc, char** argv) {
  const cachealloc::bench::Args args(argc, argv, "[threads] [pairs per thread] [off|none|native|malloc] [own|shared]", 4);
  const int threads = args.count<int>(1, 16, 1, 1024, "threads");
  const long pairs = args.count<long>(2, 200'000, 1, 1'000'000'000, "pairs per thread");
  const std::string history = args.word(3, "off", {"off", "none", "native", "malloc"}, "history");
  const std::string streams_mode = args.word(4, "own", {"own", "shared"}, "streams");
  auto device = cachealloc::make_device_from_environment();
  cachealloc::CachingAllocator allocator(device);
  std::unique_ptr<cachealloc::HistoryRecorder> recorder;
  const bool control = history == "malloc";
  if (history != "off" && !control) {
    cachealloc::HistoryOptions options;
    options.stacks = history == "native" ? cachealloc::StackCapture::native : cachealloc::StackCapture::none;
    recorder = std::make_unique<cachealloc::HistoryRecorder>(allocator, options);
  }
  std::vector<cachealloc::Stream> streams;
  for (int t = 0; t < threads; ++t) streams.push_back(device->create_stream());
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> workers;
  // Each thread's own time: one slow thread (two threads on one lock, say)
  // shows as a spread between the fastest and the slowest.
  std::vector<double> own_ns(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      const cachealloc::Stream stream = streams[streams_mode == "shared" ? 0 : static_cast<std::size_t>(t)];
      allocator.deallocate(allocator.allocate(4096, stream));  // warm: the segment exists
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      const auto own_start = std::chrono::steady_clock::now();
      const auto finish = [&] {
        own_ns[static_cast<std::size_t>(t)] =
            std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - own_start).count();
      };
      if (control) {
        std::free(std::malloc(256));
        for (long i = 0; i < pairs; ++i) {
          void* p = std::malloc(256);
          asm volatile("" : : "r"(p) : "memory");
          std::free(p);
        }
        finish();
        return;
      }
      for (long i = 0; i < pairs; ++i) {
        void* p = allocator.allocate(4096, stream);
        asm volatile("" : : "r"(p) : "memory");
        allocator.deallocate(p);
      }
      finish();
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  go.store(true);
  for (auto& w : workers) w.join();
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  const double total = static_cast<double>(pairs) * threads;
  std::printf("%s %s: %d threads x %ld pairs (%s, history %s): %.1f ns per pair in aggregate, %.1f ns per pair per thread\n",
              control ? "glibc malloc (control)" : "cachealloc", device->backend(), threads, pairs,
              control ? "256 B, no stream" : streams_mode == "shared" ? "4 KiB, one stream shared" : "4 KiB, own stream each",
              history.c_str(), ns / total, ns / static_cast<double>(pairs));
  std::sort(own_ns.begin(), own_ns.end());
  const double per_pair = static_cast<double>(pairs);
  std::printf("  per thread, ns per pair: fastest %.1f, median %.1f, slowest %.1f\n", own_ns.front() / per_pair,
              own_ns[own_ns.size() / 2] / per_pair, own_ns.back() / per_pair);
  return 0;
}
