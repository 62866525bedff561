// The process-wide allocator and recorder behind the C ABI.
#include <cstdio>
#include <mutex>

#include "cachealloc/config.hpp"
#include "cachealloc/history.hpp"

namespace cachealloc {

namespace {
std::mutex g_global_mutex;
// Never destroyed: a foreign runtime (PyTorch) may free memory from its own
// static destructors, after ours would have run.
CachingAllocator* g_allocator = nullptr;
HistoryRecorder* g_history = nullptr;
}  // namespace

CachingAllocator& global_allocator() {
  std::lock_guard lock(g_global_mutex);
  if (!g_allocator) g_allocator = new CachingAllocator(make_device_from_environment(), config_from_environment());
  return *g_allocator;
}

HistoryRecorder& global_history() {
  CachingAllocator& allocator = global_allocator();
  std::lock_guard lock(g_global_mutex);
  if (!g_history) {
    HistoryOptions off;
    off.enabled = false;
    g_history = new HistoryRecorder(allocator, off);
  }
  return *g_history;
}

void record_history(const HistoryOptions& options) { global_history().start(options); }

void stop_history() noexcept {
  try {
    global_history().stop();
  } catch (...) {
  }
}

void annotate_begin(std::string_view name) noexcept {
  try {
    global_history().annotate_begin(name);
  } catch (...) {
  }
}

void annotate_end() noexcept {
  try {
    global_history().annotate_end();
  } catch (...) {
  }
}

bool dump_snapshot(const std::filesystem::path& path) noexcept {
  try {
    return global_history().dump_snapshot(path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cachealloc: cannot dump the memory snapshot: %s\n", e.what());
    return false;
  }
}

}  // namespace cachealloc
