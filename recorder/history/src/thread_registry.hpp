// The process-wide registry of OS threads that recorded an event: events
// carry a small index, the snapshot maps it back to the thread id.
// Private to the recorder library.
#pragma once

#include <cstdint>
#include <vector>

namespace cachealloc::detail {

// A small index per OS thread, process-wide, assigned on the thread's first
// event. Thread-safe; the registry's mutex is a leaf lock (history_state.hpp).
std::uint32_t thread_index() noexcept;
// OS thread ids by index.
std::vector<std::uint64_t> registered_threads();

}  // namespace cachealloc::detail
