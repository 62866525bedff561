// A test hook into the ring (history.cpp): called by a thread after it has
// claimed a ring chunk and before it copies its events into it, outside
// ring_lock. Tests use it to hold a copy open while other threads go round
// the ring. Private to the recorder and its tests.
#pragma once

namespace cachealloc::detail {

using RingCopyHook = void (*)();
// Installs `hook` (nullptr: none) and returns the previous one.
RingCopyHook replace_ring_copy_hook(RingCopyHook hook) noexcept;

}  // namespace cachealloc::detail
