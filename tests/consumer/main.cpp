// Records a few allocations on the simulated device, dumps a snapshot, reads
// it back with the analyzer and prints one figure: every public layer, used
// the way an installed user would.
#include <cstdio>
#include <filesystem>

#include "cachealloc/analyzer/load.hpp"
#include "cachealloc/analyzer/reports.hpp"
#include "cachealloc/history.hpp"

int main(int argc, char** argv) {
  const std::filesystem::path path = argc > 1 ? argv[1] : "consumer.bin";
  cachealloc::CachingAllocator allocator(cachealloc::make_simulated_device({}));
  cachealloc::HistoryOptions options;
  options.enabled = true;
  cachealloc::HistoryRecorder history(allocator, options);
  void* block = allocator.allocate(3 << 20);
  allocator.deallocate(block);
  if (!history.dump_snapshot(path)) return 2;
  const cachealloc::snapshot::Snapshot snapshot = cachealloc::analyzer::load(path);
  const cachealloc::analyzer::Document summary = cachealloc::analyzer::summary_report(snapshot, {});
  std::printf("consumer: %zu events, report %s\n", snapshot.events.size(), summary.report.c_str());
  return snapshot.events.empty() ? 1 : 0;
}
