// bench_snapshot_size [EVENTS] [FILE]: bytes per event of a cachealloc-synthetic
// recording with native stacks (the same workload as the tool, seed 1), and
// how the file splits into events and everything else (tables, layout, header).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "args.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "workload.hpp"

int main(int argc, char** argv) {
  const cachealloc::bench::Args args(argc, argv, "[EVENTS] [FILE]", 2);
  const std::uint64_t events = args.count<std::uint64_t>(1, 1'000'000, 1, 1'000'000'000, "EVENTS");
  const std::filesystem::path path = args.has(2) ? args[2] : "bench_snapshot_size.snap";
  try {
    cachealloc::synthetic::WorkloadOptions options;
    options.events = events;
    options.seed = 1;
    options.stacks = cachealloc::StackCapture::native;
    const auto start = std::chrono::steady_clock::now();
    cachealloc::synthetic::run_workload(options, path);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    const auto file_bytes = std::filesystem::file_size(path);
    cachealloc::snapshot::Snapshot snapshot = cachealloc::snapshot::read_snapshot(path);
    const std::size_t count = snapshot.events.size();
    // What the times and the stack ids cost: re-encode without each.
    const std::size_t full = cachealloc::snapshot::encode(snapshot).size();
    auto without = [&](auto&& strip) {
      cachealloc::snapshot::Snapshot copy = snapshot;
      for (auto& event : copy.events) strip(event);
      return static_cast<double>(full - cachealloc::snapshot::encode(copy).size()) / static_cast<double>(count);
    };
    const double time_cost = without([](cachealloc::snapshot::Event& e) { e.time_ns = 0; });
    const double stack_cost = without([](cachealloc::snapshot::Event& e) { e.stack = {}; });
    snapshot.events.clear();
    const std::size_t without_events = cachealloc::snapshot::encode(snapshot).size();
    const std::size_t event_bytes = file_bytes - without_events;
    std::printf("workload + dump: %.2f s\n", seconds);
    std::printf("events %zu, dropped %llu, stacks %zu, frames %zu, strings %zu, segments %zu\n", count,
                static_cast<unsigned long long>(snapshot.dropped_events), snapshot.stacks.size() - 1,
                snapshot.frames.size() - 1, snapshot.strings.size() - 1, snapshot.segments.size());
    std::printf("file %llu B; events %zu B = %.3f B/event; everything else (tables, layout, header) %zu B\n",
                static_cast<unsigned long long>(file_bytes), event_bytes,
                static_cast<double>(event_bytes) / static_cast<double>(count), without_events);
    std::printf("of which times %.3f B/event, stack ids %.3f B/event\n", time_cost, stack_cost);
    std::printf("whole file / events = %.3f B/event\n", static_cast<double>(file_bytes) / static_cast<double>(count));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
