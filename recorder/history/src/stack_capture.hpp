// Capturing native stacks on the hot path, and interning them.
// Private to the recorder library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cachealloc/detail/spinlock.hpp"

namespace cachealloc::detail {

inline constexpr std::uint32_t kMaxStackFrames = 256;

// Writes up to `max_frames` return addresses of the caller's stack into
// `out`, innermost first, starting with the return into the caller's
// caller (the capturing function and its direct caller are skipped).
// Walks the frame-pointer chain: ~1 ns a frame. Each frame pointer must lie
// in the thread's stack (pthread_getattr_np, cached per thread), be 16-byte
// aligned and above the previous one, and the return address must lie
// outside the stack, or the walk stops. When that yields
// fewer than 2 frames (code built without frame pointers), falls back to
// the DWARF unwinder, which costs ~4 us.
std::uint32_t capture_native_stack(std::uintptr_t* out, std::uint32_t max_frames) noexcept;

// The DWARF unwinder alone (StackCapture::unwind), with the same skip as
// capture_native_stack: through code without frame pointers, ~3-5 us.
std::uint32_t capture_unwound_stack(std::uintptr_t* out, std::uint32_t max_frames) noexcept;

// The frame-pointer walk alone, for tests and benchmarks: skips `skip`
// return addresses, the first being the one into the walk's caller.
std::uint32_t walk_frame_pointers(std::uintptr_t* out, std::uint32_t max_frames, std::uint32_t skip) noexcept;

// The hash that StackTable shards and probes by, and StackCache indexes by.
// Four lanes, so the multiplies of four frames overlap: ~1.5 cycles a frame
// instead of ~6 with one chain, which a stack of 40 frames (native and
// Python) pays at every captured event.
inline std::uint64_t hash_frames(const std::uintptr_t* frames, std::uint32_t count) noexcept {
  constexpr std::uint64_t kMultiplier = 0xff51afd7ed558ccdull;
  std::uint64_t lanes[4] = {0x9e3779b97f4a7c15ull ^ count, 0xc2b2ae3d27d4eb4full, 0x165667b19e3779f9ull,
                            0x27d4eb2f165667c5ull};
  std::uint32_t i = 0;
  for (; i + 4 <= count; i += 4) {
    for (std::uint32_t lane = 0; lane < 4; ++lane) {
      lanes[lane] = (lanes[lane] ^ frames[i + lane]) * kMultiplier;
      lanes[lane] ^= lanes[lane] >> 32;
    }
  }
  for (std::uint32_t lane = 0; i < count; ++i, ++lane) {
    lanes[lane] = (lanes[lane] ^ frames[i]) * kMultiplier;
    lanes[lane] ^= lanes[lane] >> 32;
  }
  std::uint64_t h = lanes[0] ^ ((lanes[1] << 17) | (lanes[1] >> 47)) ^ ((lanes[2] << 31) | (lanes[2] >> 33)) ^
                    ((lanes[3] << 47) | (lanes[3] >> 17));
  h *= kMultiplier;
  return h ^ (h >> 32);
}

// Each unique stack stored once. intern() costs one hash over the frames and
// one short critical section on one of 16 spinlocked shards; only a stack
// never seen before allocates. Ids are shard-encoded, dense per shard, and
// never 0; stable until the table is destroyed.
class StackTable {
 public:
  StackTable();
  // Returns 0 when memory runs out (the event is then recorded without stack).
  std::uint32_t intern(const std::uintptr_t* frames, std::uint32_t count) noexcept {
    return intern(frames, count, hash_frames(frames, count));
  }
  // The same, with hash_frames(frames, count) already computed.
  std::uint32_t intern(const std::uintptr_t* frames, std::uint32_t count, std::uint64_t hash) noexcept;

  struct Entry {
    std::uint32_t id;
    std::vector<std::uintptr_t> frames;
  };
  // Every stack interned so far. Takes each shard lock in turn.
  std::vector<Entry> entries() const;
  // The frames of one stack by its id (as intern returned it); empty for an
  // id the table does not hold. One lookup, not a copy of the table.
  std::vector<std::uintptr_t> frames_of(std::uint32_t id) const;

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

// One thread's cache of the stacks it interned last, in front of a
// StackTable: a hit costs the hash and one compare of the frames, and takes
// no lock and writes no line that another thread reads. Without it, threads
// that run the same code (the same stacks) all take the same shard's lock at
// every event. Direct-mapped by hash; an entry holds the frames themselves,
// so a hit is an exact match, never a hash collision. Stacks deeper than
// kMaxFrames go to the table every time. An id is valid for the table it
// came from only: a cache serves one table (it lives in that table's
// recorder's per-thread slot) and is cleared whenever recording restarts.
// Only its owner thread uses it.
class StackCache {
 public:
  static constexpr std::uint32_t kEntries = 8;
  // Room for a merged stack: native frames down to the interpreter, then a
  // Python program's 30 or so frames. 4 KiB a thread.
  static constexpr std::uint32_t kMaxFrames = 64;

  std::uint32_t intern(StackTable& table, const std::uintptr_t* frames, std::uint32_t count) noexcept {
    // The thread's last stack first, compared without hashing: a loop
    // allocates from one stack again and again, and a compare of 40 frames
    // costs a third of their hash. Another stack differs within its first
    // few frames past the allocator's.
    if (const Entry& last = entries_[last_]; last.id != 0 && last.count == count &&
                                             std::memcmp(last.frames, frames, count * sizeof(std::uintptr_t)) == 0)
      return last.id;
    const std::uint64_t hash = hash_frames(frames, count);
    const std::uint32_t index = (hash >> 32) & (kEntries - 1);
    Entry& entry = entries_[index];
    if (entry.id != 0 && entry.hash == hash && entry.count == count &&
        std::memcmp(entry.frames, frames, count * sizeof(std::uintptr_t)) == 0) [[likely]] {
      last_ = index;
      return entry.id;
    }
    const std::uint32_t id = table.intern(frames, count, hash);
    if (id != 0 && count <= kMaxFrames) {
      entry.id = id;
      entry.hash = hash;
      entry.count = count;
      std::memcpy(entry.frames, frames, count * sizeof(std::uintptr_t));
      last_ = index;
    }
    return id;
  }
  void clear() noexcept {
    for (Entry& entry : entries_) entry.id = 0;
  }

 private:
  struct Entry {
    std::uint64_t hash = 0;
    std::uint32_t id = 0;  // 0: empty
    std::uint32_t count = 0;
    std::uintptr_t frames[kMaxFrames];
  };
  Entry entries_[kEntries];
  std::uint32_t last_ = 0;  // the entry of the thread's last stack
};

}  // namespace cachealloc::detail
