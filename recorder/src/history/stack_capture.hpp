// Capturing native stacks on the hot path, and interning them.
// Private to the recorder library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "spinlock.hpp"

namespace cachealloc::detail {

inline constexpr std::uint32_t kMaxStackFrames = 256;

// Writes up to `max_frames` return addresses of the caller's stack into
// `out`, innermost first, starting with the return into the caller's
// caller (the capturing function and its direct caller are skipped).
// Walks the frame-pointer chain: ~1 ns a frame. Each frame pointer must lie
// in the thread's stack (pthread_getattr_np, cached per thread), be 16-byte
// aligned and above the previous one, or the walk stops. When that yields
// fewer than 2 frames (code built without frame pointers), falls back to
// the DWARF unwinder, which costs ~4 us.
std::uint32_t capture_native_stack(std::uintptr_t* out, std::uint32_t max_frames) noexcept;

// The DWARF unwinder alone (StackCapture::unwind), with the same skip as
// capture_native_stack: through code without frame pointers, ~3-5 us.
std::uint32_t capture_unwound_stack(std::uintptr_t* out, std::uint32_t max_frames) noexcept;

// The frame-pointer walk alone, for tests and benchmarks: skips `skip`
// return addresses, the first being the one into the walk's caller.
std::uint32_t walk_frame_pointers(std::uintptr_t* out, std::uint32_t max_frames, std::uint32_t skip) noexcept;

// Each unique stack stored once. intern() costs one hash over the frames and
// one short critical section on one of 16 spinlocked shards; only a stack
// never seen before allocates. Ids are shard-encoded, dense per shard, and
// never 0; stable until the table is destroyed.
class StackTable {
 public:
  StackTable();
  // Returns 0 when memory runs out (the event is then recorded without stack).
  std::uint32_t intern(const std::uintptr_t* frames, std::uint32_t count) noexcept;

  struct Entry {
    std::uint32_t id;
    std::vector<std::uintptr_t> frames;
  };
  // Every stack interned so far. Takes each shard lock in turn.
  std::vector<Entry> entries() const;

 private:
  static constexpr std::uint32_t kShards = 16;
  struct Record {
    std::uint64_t hash;
    std::uint32_t offset;  // into Shard::frames
    std::uint32_t count;
  };
  struct alignas(64) Shard {
    mutable Spinlock lock;
    std::vector<std::uintptr_t> frames;  // all stacks of the shard, back to back
    std::vector<Record> records;         // index = id within the shard
    std::vector<std::uint32_t> slots;    // open addressing: record index + 1, 0 = empty
  };
  static std::uint32_t find_or_insert(Shard& shard, std::uint64_t hash, const std::uintptr_t* frames,
                                      std::uint32_t count);
  Shard shards_[kShards];
};

}  // namespace cachealloc::detail
