// PyTorch's CUDA caching allocator measured the way bench_threads measures
// ours: 4 KiB alloc+free pairs on the cached path, T threads, each on its own
// stream. Built only on a machine with PyTorch (see docs/PERFORMANCE.md):
//   g++ -O2 -std=c++17 bench/torch_peer.cpp -I$T/include -L$T/lib -lc10_cuda -lc10 \
//       -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcudart -ldl -Wl,-rpath,$T/lib -o torch_peer
// With CACHEALLOC_TORCH_LIBRARY=path/to/libcachealloc_torch.so it first makes
// our allocator PyTorch's (the extension of python/), so the same loop
// measures ours through PyTorch's own raw_alloc/raw_delete.
//   torch_peer --mixed [steps=1000000] [passes=5]
// runs the mixed workload (bench/mixed_workload.hpp, the requests
// bench_mixed gives ours) on one thread and the default stream.
//   torch_peer --default [pairs=1000000] [passes=5] [--history]
// times 4 KiB raw_alloc/raw_delete pairs on the main thread and the current
// (default) stream, best of the passes; --history first turns on PyTorch's
// history without frames (recordHistory with no context recorder, as
// _record_memory_history(stacks=None)), and for ours no native stacks.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <cstring>
#include <vector>

#include "mixed_workload.hpp"

int main(int argc, char** argv) {
  const bool mixed = argc > 1 && std::strcmp(argv[1], "--mixed") == 0;
  const bool main_thread = argc > 1 && std::strcmp(argv[1], "--default") == 0;
  if (mixed || main_thread) ++argv, --argc;
  const bool history = argc > 1 && std::strcmp(argv[argc - 1], "--history") == 0;
  if (history) --argc;
  const int threads = argc > 1 ? std::atoi(argv[1]) : 16;
  const long pairs = argc > 2 ? std::atol(argv[2]) : 200000;
  namespace alloc = c10::cuda::CUDACachingAllocator;
  const char* which = "pytorch";
  if (const char* library = std::getenv("CACHEALLOC_TORCH_LIBRARY"); library != nullptr && *library != '\0') {
    void* handle = dlopen(library, RTLD_NOW);
    auto* install = handle != nullptr ? reinterpret_cast<int (*)()>(dlsym(handle, "cachealloc_torch_install")) : nullptr;
    if (install == nullptr || install() != 0) {
      std::fprintf(stderr, "torch_peer: cannot install %s: %s\n", library, handle ? "install failed" : dlerror());
      return 2;
    }
    which = "cachealloc (extension)";
    if (history) {
      auto* stacks = reinterpret_cast<int (*)(const char*)>(dlsym(handle, "cachealloc_torch_set_stacks"));
      if (stacks == nullptr || stacks("none") != 0) {
        std::fprintf(stderr, "torch_peer: cannot turn native stacks off\n");
        return 2;
      }
    }
  }
  alloc::init(c10::cuda::device_count());
  if (history) alloc::recordHistory(true, nullptr, 1000000, alloc::RecordContext::NEVER, false, {});
  if (main_thread) {
    const long count = argc > 1 ? std::atol(argv[1]) : 1000000;
    const int passes = argc > 2 ? std::atoi(argv[2]) : 5;
    cudaSetDevice(0);
    alloc::raw_delete(alloc::raw_alloc(4096));
    double best = 1e300;
    for (int pass = 0; pass < passes; ++pass) {
      const auto start = std::chrono::steady_clock::now();
      for (long i = 0; i < count; ++i) {
        void* p = alloc::raw_alloc(4096);
        asm volatile("" : : "r"(p) : "memory");
        alloc::raw_delete(p);
      }
      const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
      best = std::min(best, ns / static_cast<double>(count));
    }
    std::printf("%s: 4 KiB pair, main thread, default stream%s, %ld pairs, best of %d passes: %.1f ns per pair\n",
                which, history ? ", history on without frames" : "", count, passes, best);
    return 0;
  }
  if (mixed) {
    const long count = argc > 1 ? std::atol(argv[1]) : 1000000;
    const int passes = argc > 2 ? std::atoi(argv[2]) : 5;
    cudaSetDevice(0);
    const auto plan = mixed_workload::steps(static_cast<std::size_t>(count));
    const double ns = mixed_workload::best_ns_per_step(
        plan, passes, [](std::size_t bytes) { return alloc::raw_alloc(bytes); }, [](void* p) { alloc::raw_delete(p); });
    const auto stats = alloc::getDeviceStats(0);
    std::printf("%s: mixed workload, %zu slots, 512 B-8 MiB, %ld steps, best of %d passes: %.1f ns per free+alloc; "
                "peak reserved %lld B, device allocs %lld\n",
                which, mixed_workload::kSlots, count, passes, ns,
                static_cast<long long>(stats.reserved_bytes[0].peak), static_cast<long long>(stats.num_device_alloc));
    return 0;
  }
  std::vector<cudaStream_t> streams(threads);
  for (auto& s : streams) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      cudaSetDevice(0);
      alloc::raw_delete(alloc::raw_alloc_with_stream(4096, streams[t]));
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      for (long i = 0; i < pairs; ++i) {
        void* p = alloc::raw_alloc_with_stream(4096, streams[t]);
        asm volatile("" : : "r"(p) : "memory");
        alloc::raw_delete(p);
      }
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  go.store(true);
  for (auto& w : workers) w.join();
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  const double total = static_cast<double>(pairs) * threads;
  std::printf("%s: %d threads x %ld pairs (4 KiB, own stream each): %.1f ns per pair in aggregate, %.1f ns per pair per thread\n",
              which, threads, pairs, ns / total, ns / static_cast<double>(pairs));
  return 0;
}
