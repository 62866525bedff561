// bench_history_overhead: what memory history costs per alloc+free pair on the
// cached path (4 KiB, one thread), side by side in one run: history off, on
// without stacks, on with native stacks, both again with the coarse clock
// (HistoryClock::coarse), and both again streamed to a file
// (HistoryOptions::stream, in $TMPDIR, removed at exit) beside the ring's.
// Each pair makes 5 events (split, alloc, free_requested, free_completed,
// merge) in two observer calls; only the alloc gets a stack.
//
// Rounds interleave the modes so that frequency changes and neighbours on a
// shared machine hit them all alike; each mode reports its best round and
// its median. A streamed mode also reports its best against the ring's
// with the same stacks ("vs ring"). Its writer runs on a thread of its own,
// and each streamed round waits, untimed, for the writer to finish that
// round's events: the rows are the recording thread's cost, and the
// writer's work stays out of the other modes' rounds. Pinned to one CPU
// (taskset -c N), the writer shares it with the loop, and what it does
// during a round lands in that round.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "args.hpp"
#include "cachealloc/history.hpp"
#include "cachealloc/snapshot/stream.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Mode {
  const char* name;
  bool history;
  cachealloc::StackCapture stacks;
  cachealloc::HistoryClock clock = cachealloc::HistoryClock::precise;
  bool streamed = false;
  int ring_mode = -1;  // a streamed mode: the ring mode with the same stacks ("vs ring")
};

// The stream files, removed at exit (also when a round throws).
struct StreamFiles {
  std::vector<std::filesystem::path> paths;
  std::filesystem::path make(std::size_t mode) {
    paths.push_back(std::filesystem::temp_directory_path() /
                    ("bench_history_overhead." + std::to_string(::getpid()) + "." + std::to_string(mode) + ".bin"));
    return paths.back();
  }
  ~StreamFiles() {
    std::error_code ignored;
    for (const auto& path : paths) std::filesystem::remove(path, ignored);
  }
};

// A few frames between main and the allocator, as in a real program.
__attribute__((noinline)) void pairs(cachealloc::CachingAllocator& allocator, long count) {
  for (long i = 0; i < count; ++i) {
    void* p = allocator.allocate(4096);
    asm volatile("" : : "r"(p) : "memory");
    allocator.deallocate(p);
  }
}

__attribute__((noinline)) double ns_per_pair(cachealloc::CachingAllocator& allocator, long count) {
  const auto start = Clock::now();
  pairs(allocator, count);
  const auto elapsed = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
  return elapsed / static_cast<double>(count);
}

// Waits, untimed, until a streamed mode's writer has written what its round
// recorded, so that the writer's work does not fall into the next mode's
// round: the rows time the recording thread. The writer keeps back at most
// a partial block (kStreamBlockEvents) and this thread's staging chunk; then
// its count must stay put for three of its cuts (20 ms apart). Gives up
// after 30 s (a writer that failed says so in stream_status().error).
void wait_for_writer(const cachealloc::HistoryRecorder& recorder) {
  constexpr std::uint64_t kHeldBack = cachealloc::snapshot::kStreamBlockEvents + 2048;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  std::uint64_t written = recorder.stream_status().events_written;
  for (int still = 0; still < 60 && Clock::now() < deadline;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const std::uint64_t now = recorder.stream_status().events_written;
    const bool caught_up = now + kHeldBack >= recorder.recorded_events();
    still = caught_up && now == written ? still + 1 : 0;
    written = now;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const cachealloc::bench::Args args(argc, argv, "[pairs per round] [rounds]", 2);
  const long pairs_per_round = args.count<long>(1, 500'000, 1, 10'000'000'000, "pairs per round");
  const int rounds = args.count<int>(2, 9, 1, 1000, "rounds");
  const Mode modes[] = {
      {"history off", false, cachealloc::StackCapture::none},
      {"history on, no stacks", true, cachealloc::StackCapture::none},
      {"history on, native stacks", true, cachealloc::StackCapture::native},
      {"no stacks, coarse clock", true, cachealloc::StackCapture::none, cachealloc::HistoryClock::coarse},
      {"native stacks, coarse clock", true, cachealloc::StackCapture::native, cachealloc::HistoryClock::coarse},
      {"streamed, no stacks", true, cachealloc::StackCapture::none, cachealloc::HistoryClock::precise, true, 1},
      {"streamed, native stacks", true, cachealloc::StackCapture::native, cachealloc::HistoryClock::precise, true, 2},
  };
  StreamFiles stream_files;
  std::vector<std::unique_ptr<cachealloc::CachingAllocator>> allocators;
  std::vector<std::unique_ptr<cachealloc::HistoryRecorder>> recorders;
  std::vector<cachealloc::HistoryRecorder*> recorder_of(std::size(modes), nullptr);
  for (std::size_t m = 0; m < std::size(modes); ++m) {
    const Mode& mode = modes[m];
    allocators.push_back(std::make_unique<cachealloc::CachingAllocator>(cachealloc::make_simulated_device()));
    allocators.back()->deallocate(allocators.back()->allocate(4096));  // the segment exists: cached path from here
    if (mode.history) {
      cachealloc::HistoryOptions options;
      options.stacks = mode.stacks;
      options.clock = mode.clock;
      options.max_entries = std::getenv("RING") ? std::strtoul(std::getenv("RING"), nullptr, 0) : 1u << 20;  // overflows: the steady state of a long run
      if (mode.streamed) options.stream = stream_files.make(m);
      recorders.push_back(std::make_unique<cachealloc::HistoryRecorder>(*allocators.back(), options));
      recorder_of[m] = recorders.back().get();
    }
  }
  std::vector<std::vector<double>> results(std::size(modes));
  // ONLY=m runs mode m alone (0 off, 1 no stacks, 2 native, 3 and 4 the
  // same with the coarse clock, 5 and 6 streamed), for a profile or an
  // instruction count per mode under valgrind --tool=callgrind.
  const char* only = std::getenv("ONLY");
  for (int round = 0; round < rounds; ++round)
    for (std::size_t m = 0; m < std::size(modes); ++m) {
      if (only && std::strtoul(only, nullptr, 10) != m) {
        results[m].push_back(1.0);
        continue;
      }
      results[m].push_back(ns_per_pair(*allocators[m], pairs_per_round));
      if (modes[m].streamed) wait_for_writer(*recorder_of[m]);
    }

  std::printf("alloc+free pairs of 4 KiB on the cached path, one thread, %ld pairs x %d rounds\n", pairs_per_round,
              rounds);
  std::printf("%-28s %12s %12s %10s %10s\n", "mode", "best ns/pair", "median", "vs off", "vs ring");
  for (std::vector<double>& r : results) std::sort(r.begin(), r.end());
  const double off = results[0].front();
  for (std::size_t m = 0; m < std::size(modes); ++m) {
    const std::vector<double>& r = results[m];
    const double best = r.front();
    std::printf("%-28s %12.1f %12.1f %9.2fx", modes[m].name, best, r[r.size() / 2], best / off);
    if (modes[m].ring_mode >= 0) std::printf(" %9.2fx", best / results[static_cast<std::size_t>(modes[m].ring_mode)].front());
    std::printf("\n");
  }
  // The streams end here (their trailers written) before the files go.
  recorders.clear();
  return 0;
}
