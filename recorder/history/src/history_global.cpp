// The process-wide allocator and recorder behind the C ABI.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
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

HistoryRecorder& make_history_locked(CachingAllocator& allocator) {
  if (!g_history) {
    HistoryOptions off;
    off.enabled = false;
    g_history = new HistoryRecorder(allocator, off);
  }
  return *g_history;
}

// The process never destroys the recorder, so without this a stream that
// CACHEALLOC_HISTORY started would end without its trailer (read as if
// killed, its final stats unknown).
void finish_environment_stream() noexcept { stop_history(); }

// CACHEALLOC_HISTORY's recording, on the allocator just created. A file
// that cannot be created is a failure of the recording, not of the program.
void start_environment_history(CachingAllocator& allocator, HistoryOptions options) {
  options.stream = expand_stream_path(options.stream.native(), static_cast<long>(getpid()), allocator.device().index());
  try {
    make_history_locked(allocator).start(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cachealloc: %s: %s; not recording\n", kHistoryEnvironment, e.what());
    return;
  }
  std::atexit(finish_environment_stream);
}
}  // namespace

CachingAllocator& global_allocator() {
  std::lock_guard lock(g_global_mutex);
  if (!g_allocator) {
    // Parsed first: a bad setting leaves no allocator, as a bad CACHEALLOC_CONF does.
    const char* setting = std::getenv(kHistoryEnvironment);
    const bool wanted = setting != nullptr && *setting != '\0';
    const HistoryOptions options = wanted ? parse_history_setting(setting) : HistoryOptions{};
    g_allocator = new CachingAllocator(make_device_from_environment(), config_from_environment());
    if (wanted) start_environment_history(*g_allocator, options);
  }
  return *g_allocator;
}

HistoryRecorder& global_history() {
  CachingAllocator& allocator = global_allocator();
  std::lock_guard lock(g_global_mutex);
  return make_history_locked(allocator);
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

void tag_category(std::uintptr_t address, events::AllocationCategory category) noexcept {
  try {
    global_history().tag_category(address, category);
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
