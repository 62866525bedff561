// Test hooks into the recorder (ring.cpp, recording.cpp). Private to the
// recorder and its tests.
//
// The ring copy hook is called by a thread after it has claimed a ring chunk
// and before it copies its events into it, outside ring_lock. Tests use it
// to hold a copy open while other threads go round the ring.
#pragma once

#include <cstdint>

namespace cachealloc::detail {

using RingCopyHook = void (*)();
// Installs `hook` (nullptr: none) and returns the previous one.
RingCopyHook replace_ring_copy_hook(RingCopyHook hook) noexcept;

// Adds `ticks` to every clock read of the calling thread's events from now
// on: a clock that runs ahead on one thread stands for reads that execute
// out of order, as an unordered RDTSC may. One add on the hot path.
void set_thread_clock_skew(std::int64_t ticks) noexcept;

// Called by a streamed recording's writer before each cut, outside every
// lock. Tests use it to stall the writer, as a slow disk would.
using StreamCutHook = void (*)();
StreamCutHook replace_stream_cut_hook(StreamCutHook hook) noexcept;
// Called by the writer once a cut has begun (recording threads that find
// the buffers full then take the reserve or spill) and before it takes the
// shard locks: tests stall it there, as a cut behind a long allocator call.
StreamCutHook replace_stream_locking_hook(StreamCutHook hook) noexcept;

}  // namespace cachealloc::detail
