// The C ABI (cachealloc.h) over global_allocator() and global_history().
// Every entry point catches everything: no exception crosses into C.
#include "cachealloc/cachealloc.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "cachealloc/errors.hpp"
#include "cachealloc/history.hpp"
#include "cachealloc/snapshot/format.hpp"

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
  } catch (const cachealloc::snapshot::SnapshotError& e) {
    remember(e.what());
    return e.code() == cachealloc::snapshot::ErrorCode::io ? CACHEALLOC_IO_ERROR : CACHEALLOC_DEVICE_ERROR;
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

cachealloc::StackCapture stack_capture(int stacks, const char* function) {
  using cachealloc::StackCapture;
  switch (stacks) {
    case CACHEALLOC_STACKS_NONE: return StackCapture::none;
    case CACHEALLOC_STACKS_NATIVE: return StackCapture::native;
    case CACHEALLOC_STACKS_UNWIND: return StackCapture::unwind;
    case CACHEALLOC_STACKS_PYTHON: return StackCapture::python;
    case CACHEALLOC_STACKS_NATIVE_PYTHON: return StackCapture::native_python;
    case CACHEALLOC_STACKS_UNWIND_PYTHON: return StackCapture::unwind_python;
    default: break;
  }
  throw cachealloc::InvalidArgument(std::string(function) + ": unknown stacks value " + std::to_string(stacks));
}

cachealloc::HistoryOptions history_options(const cachealloc_history_options* options, const char* function) {
  if (!options) throw cachealloc::InvalidArgument(std::string(function) + ": options is NULL");
  cachealloc::HistoryOptions o;
  o.enabled = options->enabled != 0;
  o.max_entries = static_cast<std::size_t>(options->max_entries);
  o.stacks = stack_capture(options->stacks, function);
  o.max_frames = options->max_frames;
  o.stacks_on_free = options->stacks_on_free != 0;
  if (options->dump_on_oom) o.dump_on_oom = options->dump_on_oom;
  return o;
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

void cachealloc_stream_options_init(cachealloc_stream_options* stream) {
  if (!stream) return;
  const cachealloc::HistoryOptions defaults;
  stream->size = sizeof(cachealloc_stream_options);
  stream->path = nullptr;
  stream->buffer_bytes = defaults.stream_buffer_bytes;
  stream->when_full = CACHEALLOC_STREAM_WAIT;
}

int cachealloc_record_history_stream(const cachealloc_history_options* options,
                                     const cachealloc_stream_options* stream) {
  return guarded([&] {
    cachealloc::HistoryOptions o = history_options(options, "cachealloc_record_history_stream");
    if (stream) {
      // Every field so far is in the first version of the struct; a later
      // one is read only when `size` says the caller has it.
      if (stream->size < sizeof(cachealloc_stream_options))
        throw cachealloc::InvalidArgument(
            "cachealloc_record_history_stream: stream->size is " + std::to_string(stream->size) +
            ", smaller than the first version of cachealloc_stream_options (call cachealloc_stream_options_init)");
      if (stream->when_full != CACHEALLOC_STREAM_WAIT && stream->when_full != CACHEALLOC_STREAM_DROP)
        throw cachealloc::InvalidArgument("cachealloc_record_history_stream: unknown when_full value " +
                                          std::to_string(stream->when_full));
      if (stream->path && *stream->path) {
        o.stream = cachealloc::expand_stream_path(stream->path, static_cast<long>(getpid()),
                                                 cachealloc::global_allocator().device().index());
        o.stream_buffer_bytes = static_cast<std::size_t>(stream->buffer_bytes);
        o.stream_when_full = stream->when_full == CACHEALLOC_STREAM_DROP ? cachealloc::StreamWhenFull::drop
                                                                         : cachealloc::StreamWhenFull::wait;
      }
    }
    cachealloc::record_history(o);
    return CACHEALLOC_OK;
  });
}

int cachealloc_record_history(const cachealloc_history_options* options) {
  return guarded([&] {
    cachealloc::record_history(history_options(options, "cachealloc_record_history"));
    return CACHEALLOC_OK;
  });
}

void cachealloc_stream_progress(uint64_t* events_written, uint64_t* dropped_events) {
  cachealloc::StreamStatus status;
  guarded([&] {
    status = cachealloc::global_history().stream_status();
    return CACHEALLOC_OK;
  });
  if (events_written) *events_written = status.events_written;
  if (dropped_events) *dropped_events = status.dropped_events;
}

void cachealloc_stop_history(void) { cachealloc::stop_history(); }

void cachealloc_annotate_begin(const char* name) {
  if (name) cachealloc::annotate_begin(name);
}

void cachealloc_annotate_end(void) { cachealloc::annotate_end(); }

int cachealloc_tag_category(const void* ptr, const char* category) {
  return guarded([&] {
    cachealloc::events::AllocationCategory code{};
    if (!category || !cachealloc::events::parse_allocation_category(category, code)) {
      throw cachealloc::InvalidArgument(std::string("cachealloc_tag_category: unknown category \"") +
                                        (category ? category : "(null)") +
                                        "\" (parameter, gradient, optimizer_state, activation, temporary, workspace, "
                                        "cuda_graph_pool or other)");
    }
    cachealloc::tag_category(reinterpret_cast<std::uintptr_t>(ptr), code);
    return CACHEALLOC_OK;
  });
}

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

void cachealloc_frame_source_init(cachealloc_frame_source* source) {
  if (!source) return;
  *source = cachealloc_frame_source{};
  source->size = sizeof(cachealloc_frame_source);
}

int cachealloc_set_frame_source(const cachealloc_frame_source* source) {
  return guarded([&] {
    if (!source) {
      cachealloc::set_frame_source(nullptr);
      return CACHEALLOC_OK;
    }
    // A caller's struct from an older header ends early: its missing fields stay zero.
    cachealloc_frame_source copy{};
    std::memcpy(&copy, source, std::min(source->size, sizeof(copy)));
    cachealloc::set_frame_source(&copy);
    return CACHEALLOC_OK;
  });
}

const char* cachealloc_last_error(void) { return t_last_error.c_str(); }

}  // extern "C"
