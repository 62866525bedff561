// The allocator's layout as plain values: segments in address order, each
// covered by its blocks. CachingAllocator::layout() returns it; the history
// stores it in a snapshot, whose model (cachealloc/snapshot/model.hpp) uses
// these same types, and the analyzer rebuilds it at any event.
//
// Header-only, so that the snapshot library shares it without linking the
// allocator. Thread safety: plain values, no internal synchronization.
#pragma once

#include <cstdint>
#include <vector>

namespace cachealloc::layout {

// The allocation site of a block or segment: an id the allocator's observer
// returned for the alloc event (the history's stack table). 0 is "none".
struct StackId {
  std::uint32_t value = 0;
  friend bool operator==(StackId, StackId) = default;
  friend auto operator<=>(StackId, StackId) = default;
  explicit operator bool() const { return value != 0; }
};

enum class BlockState : std::uint8_t {
  active_allocated = 0,     // handed out and not freed
  active_pending_free = 1,  // freed by the program, waiting for stream events
  inactive = 2,             // cached: free for reuse
  unmapped = 3,             // expandable segment address range with no memory behind it
};

inline const char* to_string(BlockState state) noexcept {
  switch (state) {
    case BlockState::active_allocated: return "active_allocated";
    case BlockState::active_pending_free: return "active_pending_free";
    case BlockState::inactive: return "inactive";
    case BlockState::unmapped: return "unmapped";
  }
  return "unknown";
}

struct Block {
  std::uint64_t address = 0;
  std::uint64_t size = 0;       // block size (rounded)
  std::uint64_t requested = 0;  // requested bytes, 0 when inactive
  BlockState state = BlockState::inactive;
  StackId stack{};              // where it was allocated, when known
  friend bool operator==(const Block&, const Block&) = default;
};

struct Segment {
  std::int32_t device = 0;
  std::uint64_t stream = 0;
  std::uint64_t address = 0;
  std::uint64_t total_size = 0;  // reserved bytes of this segment
  bool large_pool = false;
  bool expandable = false;
  StackId stack{};               // where the segment was allocated, when known
  std::vector<Block> blocks;     // in address order, covering [address, address + total_size)
  friend bool operator==(const Segment&, const Segment&) = default;
};

}  // namespace cachealloc::layout
