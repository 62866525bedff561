// cachealloc-example-shared-gpu: one of several processes sharing a GPU, to
// hold the snapshot's NVML figures to nvidia-smi (docs/VERIFICATION.md,
// "NVML's figures against nvidia-smi"). It allocates through our allocator, optionally reserves memory
// outside it (cudaMalloc on the cuda backend, as cuBLAS or NCCL would),
// and dumps a snapshot at a moment a script chooses, while nothing changes:
//
//   cachealloc-example-shared-gpu --allocate 3GiB --outside 1GiB --snapshot a.bin --sync DIR/a
//
// With --sync PREFIX it writes PREFIX.ready once its memory is in place,
// waits for PREFIX.go, dumps, writes PREFIX.done, waits for PREFIX.quit,
// then frees everything and exits. The script runs nvidia-smi between
// .done and .quit, when every process holds still.
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "cachealloc/history.hpp"

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

void touch(const std::string& path) { std::ofstream(path) << "ok\n"; }

bool wait_for(const std::string& path, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!std::filesystem::exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Hold memory on the GPU through cachealloc (and, with --outside, beside it), dump a snapshot when told."};
  app.set_version_flag("--version,-V", CACHEALLOC_VERSION);
  std::uint64_t allocate_mib = 1024;
  std::uint64_t outside_mib = 0;
  std::string snapshot = "shared-gpu.bin";
  std::string sync;
  app.add_option("--allocate-mib", allocate_mib, "MiB to allocate through the allocator, in 256 MiB tensors plus small ones")
      ->capture_default_str()
      ->check(CLI::Range(1ull, 1ull << 24));
  app.add_option("--outside-mib", outside_mib, "MiB to reserve beside the allocator (cudaMalloc on the cuda backend)")
      ->capture_default_str()
      ->check(CLI::Range(0ull, 1ull << 24));
  app.add_option("--snapshot", snapshot, "where to dump the snapshot")->capture_default_str();
  app.add_option("--sync", sync, "file prefix for .ready/.go/.done/.quit with a driving script");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "cachealloc-example-shared-gpu: error: %s\n", e.what());
    return 2;
  }
  try {
    auto device = cachealloc::make_device_from_environment();
    cachealloc::CachingAllocator allocator(device, cachealloc::config_from_environment());
    cachealloc::HistoryRecorder history(allocator, cachealloc::HistoryOptions{});
    std::vector<void*> tensors;
    for (std::uint64_t left = allocate_mib * kMiB; left > 0;) {
      const std::uint64_t size = std::min<std::uint64_t>(left, 256 * kMiB);
      tensors.push_back(allocator.allocate(size));
      left -= size;
    }
    for (int i = 0; i < 100; ++i) tensors.push_back(allocator.allocate(4096 + 512 * static_cast<std::size_t>(i)));
    for (std::size_t i = 0; i < tensors.size(); i += 3) {  // something cached, as after a training step
      allocator.deallocate(tensors[i]);
      tensors[i] = nullptr;
    }
    void* outside = outside_mib ? device->reserve(outside_mib * kMiB) : nullptr;
    if (outside_mib && !outside) throw std::runtime_error("the device is out of memory for --outside-mib");
    if (!sync.empty()) {
      touch(sync + ".ready");
      if (!wait_for(sync + ".go", std::chrono::seconds(120))) throw std::runtime_error("no " + sync + ".go in 120 s");
    }
    if (!history.dump_snapshot(snapshot)) return 1;
    std::printf("pid %ld: allocated %llu MiB, reserved %llu MiB, outside the allocator %llu MiB, snapshot %s\n",
                static_cast<long>(::getpid()), static_cast<unsigned long long>(allocator.memory_allocated() / kMiB),
                static_cast<unsigned long long>(allocator.memory_reserved() / kMiB),
                static_cast<unsigned long long>(outside_mib), snapshot.c_str());
    std::fflush(stdout);
    if (!sync.empty()) {
      touch(sync + ".done");
      if (!wait_for(sync + ".quit", std::chrono::seconds(120))) throw std::runtime_error("no " + sync + ".quit in 120 s");
    }
    if (outside) device->release(outside, outside_mib * kMiB);
    for (void* tensor : tensors)
      if (tensor) allocator.deallocate(tensor);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cachealloc-example-shared-gpu: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
