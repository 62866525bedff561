// The C ABI (cachealloc.h) over global_allocator() and global_history().
// Every entry point catches everything: no exception crosses into C.
#include "cachealloc/cachealloc.h"

#include <cstdio>
#include <string>

#include "cachealloc/errors.hpp"
#include "cachealloc/history.hpp"

namespace {

thread_local std::string t_last_error;

void remember(const char* what) noexcept {
  try {
    t_last_error = what;
  } catch (...) {
  }
}

template <class Body>
int guarded(Body&& body) noexcept {
  try {
    return body();
  } catch (const cachealloc::InvalidArgument& e) {
    remember(e.what());
    return CACHEALLOC_INVALID_ARGUMENT;
  } catch (const cachealloc::ConfigError& e) {
    remember(e.what());
    return CACHEALLOC_INVALID_ARGUMENT;
  } catch (const std::exception& e) {
    remember(e.what());
    return CACHEALLOC_DEVICE_ERROR;
  } catch (...) {
    remember("unknown error");
    return CACHEALLOC_DEVICE_ERROR;
  }
}

template <typename Read>
uint64_t read_stat(Read&& read) {
  uint64_t value = 0;
  guarded([&] {
    value = static_cast<uint64_t>(read(cachealloc::global_allocator()));
    return CACHEALLOC_OK;
  });
  return value;
}

}  // namespace

extern "C" {

void cachealloc_history_options_init(cachealloc_history_options* options) {
  if (!options) return;
  const cachealloc::HistoryOptions defaults;
  options->enabled = 1;
  options->max_entries = defaults.max_entries;
  options->stacks = defaults.stacks == cachealloc::StackCapture::native ? CACHEALLOC_STACKS_NATIVE
                                                                        : CACHEALLOC_STACKS_NONE;
  options->max_frames = defaults.max_frames;
  options->stacks_on_free = defaults.stacks_on_free ? 1 : 0;
  options->dump_on_oom = nullptr;
}

int cachealloc_record_history(const cachealloc_history_options* options) {
  return guarded([&] {
    if (!options) throw cachealloc::InvalidArgument("cachealloc_record_history: options is NULL");
    if (options->stacks != CACHEALLOC_STACKS_NONE && options->stacks != CACHEALLOC_STACKS_NATIVE)
      throw cachealloc::InvalidArgument("cachealloc_record_history: unknown stacks value " +
                                        std::to_string(options->stacks));
    cachealloc::HistoryOptions o;
    o.enabled = options->enabled != 0;
    o.max_entries = static_cast<std::size_t>(options->max_entries);
    o.stacks = options->stacks == CACHEALLOC_STACKS_NATIVE ? cachealloc::StackCapture::native
                                                           : cachealloc::StackCapture::none;
    o.max_frames = options->max_frames;
    o.stacks_on_free = options->stacks_on_free != 0;
    if (options->dump_on_oom) o.dump_on_oom = options->dump_on_oom;
    cachealloc::record_history(o);
    return CACHEALLOC_OK;
  });
}

void cachealloc_stop_history(void) { cachealloc::stop_history(); }

void cachealloc_annotate_begin(const char* name) {
  if (name) cachealloc::annotate_begin(name);
}

void cachealloc_annotate_end(void) { cachealloc::annotate_end(); }

int cachealloc_dump_snapshot(const char* path) {
  return guarded([&] {
    if (!path || !*path) throw cachealloc::InvalidArgument("cachealloc_dump_snapshot: no path");
    if (!cachealloc::dump_snapshot(path)) {
      remember("the snapshot could not be written (see stderr); recording is off");
      return CACHEALLOC_IO_ERROR;
    }
    return CACHEALLOC_OK;
  });
}

void* cachealloc_malloc(size_t size, uintptr_t stream) {
  void* result = nullptr;
  guarded([&] {
    try {
      result = cachealloc::global_allocator().allocate(size, cachealloc::Stream{stream});
    } catch (const cachealloc::OutOfMemoryError&) {
      // A dump on OOM runs on a helper thread; let it finish before the
      // caller sees NULL, so the snapshot is there when it looks.
      cachealloc::global_history().flush();
      throw;
    }
    return CACHEALLOC_OK;
  });
  return result;
}

void cachealloc_free(void* ptr, size_t /*size*/, uintptr_t /*stream*/) {
  guarded([&] {
    if (ptr) cachealloc::global_allocator().deallocate(ptr);
    return CACHEALLOC_OK;
  });
}

void* cachealloc_torch_malloc(ptrdiff_t size, int device, void* stream) {
  if (size <= 0) return nullptr;  // PyTorch asks for 0 bytes for empty tensors
  void* result = nullptr;
  guarded([&] {
    cachealloc::CachingAllocator& allocator = cachealloc::global_allocator();
    if (device != allocator.device().index())
      throw cachealloc::InvalidArgument("cachealloc serves device " + std::to_string(allocator.device().index()) +
                                        " in this process, not device " + std::to_string(device));
    try {
      result = allocator.allocate(static_cast<std::size_t>(size), cachealloc::Stream{reinterpret_cast<std::uintptr_t>(stream)});
    } catch (const cachealloc::OutOfMemoryError&) {
      cachealloc::global_history().flush();
      throw;
    }
    return CACHEALLOC_OK;
  });
  if (!result) std::fprintf(stderr, "cachealloc: %s\n", t_last_error.c_str());
  return result;
}

void cachealloc_torch_free(void* ptr, ptrdiff_t /*size*/, int /*device*/, void* /*stream*/) {
  guarded([&] {
    if (ptr) cachealloc::global_allocator().deallocate(ptr);
    return CACHEALLOC_OK;
  });
}

uint64_t cachealloc_memory_allocated(void) {
  return read_stat([](auto& a) { return a.memory_allocated(); });
}
uint64_t cachealloc_memory_reserved(void) {
  return read_stat([](auto& a) { return a.memory_reserved(); });
}
uint64_t cachealloc_max_memory_allocated(void) {
  return read_stat([](auto& a) { return a.max_memory_allocated(); });
}
uint64_t cachealloc_max_memory_reserved(void) {
  return read_stat([](auto& a) { return a.max_memory_reserved(); });
}
void cachealloc_reset_peak_stats(void) {
  guarded([] {
    cachealloc::global_allocator().reset_peak_stats();
    return CACHEALLOC_OK;
  });
}
int cachealloc_empty_cache(void) {
  return guarded([] {
    cachealloc::global_allocator().empty_cache();
    return CACHEALLOC_OK;
  });
}

const char* cachealloc_last_error(void) { return t_last_error.c_str(); }

}  // extern "C"
