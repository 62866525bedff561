#include "stack_capture.hpp"

#include <pthread.h>

#include <boost/stacktrace/safe_dump_to.hpp>

#include <algorithm>
#include <cstring>
#include <new>

namespace cachealloc::detail {
namespace {

struct StackBounds {
  std::uintptr_t low = 0;
  std::uintptr_t high = 0;  // one past the end
};

// pthread_getattr_np reads /proc/self/maps for the main thread, so it runs
// once per thread, not per event.
StackBounds current_stack_bounds() noexcept {
  thread_local StackBounds bounds = [] {
    StackBounds b;
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      void* address = nullptr;
      std::size_t size = 0;
      if (pthread_attr_getstack(&attr, &address, &size) == 0) {
        b.low = reinterpret_cast<std::uintptr_t>(address);
        b.high = b.low + size;
      }
      pthread_attr_destroy(&attr);
    }
    return b;
  }();
  return bounds;
}

}  // namespace

// x86-64 and AArch64 frame records: [fp] = caller's fp, [fp + 8] = return
// address. noinline so that our own frame is a known one to skip.
__attribute__((noinline)) std::uint32_t walk_frame_pointers(std::uintptr_t* out, std::uint32_t max_frames,
                                                            std::uint32_t skip) noexcept {
  const StackBounds bounds = current_stack_bounds();
  auto fp = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  std::uint32_t count = 0;
  while (count < max_frames) {
    if (fp < bounds.low || fp + 2 * sizeof(std::uintptr_t) > bounds.high || (fp & 0xf) != 0) break;
    const auto* record = reinterpret_cast<const std::uintptr_t*>(fp);
    const std::uintptr_t next = record[0];
    const std::uintptr_t ip = record[1];
    // A "return address" inside the stack is a frame pointer that code
    // without frame pointers left behind (libffi under ctypes): the chain
    // has left real frames.
    if (ip == 0 || (ip >= bounds.low && ip < bounds.high)) break;
    if (skip == 0)
      out[count++] = ip;
    else
      --skip;
    if (next <= fp) break;
    fp = next;
  }
  return count;
}

namespace {
// The DWARF unwinder, inlined into each capturing function so that the skip
// of 2 drops that function and its caller (the recorder) in both.
__attribute__((always_inline)) inline std::uint32_t unwind_into(std::uintptr_t* out, std::uint32_t max_frames) noexcept {
  void* buffer[kMaxStackFrames + 1] = {};
  const std::uint32_t room = std::min(max_frames, kMaxStackFrames) + 1;  // + the terminating null
  const std::size_t got = boost::stacktrace::safe_dump_to(2, buffer, room * sizeof(void*));
  std::uint32_t count = 0;
  for (std::size_t i = 0; i < got && count < max_frames && buffer[i]; ++i)
    out[count++] = reinterpret_cast<std::uintptr_t>(buffer[i]);
  return count;
}
}  // namespace

__attribute__((noinline)) std::uint32_t capture_native_stack(std::uintptr_t* out, std::uint32_t max_frames) noexcept {
  // Skip the returns into us and into our caller (the recorder), so stacks
  // start at the code that called the observer.
  std::uint32_t count = walk_frame_pointers(out, max_frames, 2);
  if (count >= 2 || max_frames < 2) return count;
  // No frame pointers above us: ask the DWARF unwinder. It reports raw
  // return addresses too, so both paths intern the same kind of values.
  return unwind_into(out, max_frames);
}

__attribute__((noinline)) std::uint32_t capture_unwound_stack(std::uintptr_t* out, std::uint32_t max_frames) noexcept {
  return unwind_into(out, max_frames);
}

StackTable::StackTable() {
  for (Shard& shard : shards_) shard.slots.assign(64, 0);
}

std::uint32_t StackTable::find_or_insert(Shard& shard, std::uint64_t hash, const std::uintptr_t* frames,
                                         std::uint32_t count) {
  std::size_t mask = shard.slots.size() - 1;
  for (std::size_t i = (hash >> 4) & mask;; i = (i + 1) & mask) {
    const std::uint32_t slot = shard.slots[i];
    if (slot == 0) break;
    const Record& r = shard.records[slot - 1];
    if (r.hash == hash && r.count == count &&
        std::memcmp(&shard.frames[r.offset], frames, count * sizeof(std::uintptr_t)) == 0)
      return slot - 1;
  }
  // A stack never seen before: the only path that allocates.
  const auto index = static_cast<std::uint32_t>(shard.records.size());
  // Frames before the record: if either throws (out of memory), no record
  // is left pointing at frames that were never stored.
  const auto offset = static_cast<std::uint32_t>(shard.frames.size());
  shard.frames.insert(shard.frames.end(), frames, frames + count);
  shard.records.push_back(Record{hash, offset, count});
  if (shard.records.size() * 2 > shard.slots.size()) {
    std::vector<std::uint32_t> grown(shard.slots.size() * 2, 0);
    mask = grown.size() - 1;
    for (std::uint32_t r = 0; r < shard.records.size(); ++r) {
      std::size_t i = (shard.records[r].hash >> 4) & mask;
      while (grown[i] != 0) i = (i + 1) & mask;
      grown[i] = r + 1;
    }
    shard.slots.swap(grown);
  } else {
    std::size_t i = (hash >> 4) & mask;
    while (shard.slots[i] != 0) i = (i + 1) & mask;
    shard.slots[i] = index + 1;
  }
  return index;
}

std::uint32_t StackTable::intern(const std::uintptr_t* frames, std::uint32_t count, std::uint64_t hash) noexcept {
  const auto shard_index = static_cast<std::uint32_t>(hash & (kShards - 1));
  Shard& shard = shards_[shard_index];
  try {
    std::lock_guard lock(shard.lock);
    const std::uint32_t local = find_or_insert(shard, hash, frames, count);
    return (local * kShards + shard_index) + 1;
  } catch (const std::bad_alloc&) {
    return 0;
  }
}

std::vector<std::uintptr_t> StackTable::frames_of(std::uint32_t id) const {
  if (id == 0) return {};
  const Shard& shard = shards_[(id - 1) % kShards];
  const std::uint32_t local = (id - 1) / kShards;
  std::lock_guard lock(shard.lock);
  if (local >= shard.records.size()) return {};
  const Record& record = shard.records[local];
  return {shard.frames.begin() + record.offset, shard.frames.begin() + record.offset + record.count};
}

std::vector<StackTable::Entry> StackTable::entries() const {
  std::vector<Entry> out;
  for (std::uint32_t s = 0; s < kShards; ++s) {
    const Shard& shard = shards_[s];
    std::lock_guard lock(shard.lock);
    for (std::uint32_t r = 0; r < shard.records.size(); ++r) {
      const Record& record = shard.records[r];
      out.push_back(Entry{r * kShards + s + 1, {shard.frames.begin() + record.offset,
                                                shard.frames.begin() + record.offset + record.count}});
    }
  }
  return out;
}

}  // namespace cachealloc::detail
