// The block each PyTorch allocation received, from its trace.
//
// PyTorch's trace records where an allocation went and how many bytes were
// requested, not the size of the block it got. That size follows from the
// allocator's policy and the layout at that moment: the request is rounded
// (round_size), and the free block at that address is split when
// should_split() says so, or handed out whole otherwise (a cached block a
// little larger than the request, an oversize block, the tail of a segment).
// BlockSizer keeps the layout the trace implies, block by block, and applies
// the same rule (CUDACachingAllocator.cpp, PyTorch 2.11):
//   small pool or expandable segments: split when the rest is >= 512 B;
//   large pool: split when the rounded size is below max_split_size and the
//   rest is more than 1 MiB.
// Frees merge with free neighbours of the same segment, as free_block() does;
// expandable segments grow and shrink with segment_map and segment_unmap.
//
// An allocation the layout cannot explain (the trace began mid-run, or the
// file is not what PyTorch wrote) gets no size here; the caller falls back
// and counts it, and the figures that depend on it become bounds.
//
// Cost: two hash look-ups per alloc and per free; segment_unmap, which is
// rare, walks the blocks of expandable segments.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "cachealloc/snapshot/detail/flat_map.hpp"
#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::snapshot::detail {

struct BlockPolicy {
  std::array<std::uint64_t, 16> divisions{};  // roundup_power2_divisions by interval (pytorch_round_size)
  std::uint64_t max_split_size = std::numeric_limits<std::uint64_t>::max();
  bool expandable_segments = false;
};

class BlockSizer {
 public:
  explicit BlockSizer(const BlockPolicy& policy) : policy_(policy) {}

  void segment_alloc(std::uint64_t address, std::uint64_t size, bool small_pool) {
    if (size == 0) return;
    segment_release(address);  // a segment PyTorch reports twice replaces the first
    const std::uint32_t id = new_block(address, size, small_pool, false);
    starts_.insert(address, id);
  }

  void segment_release(std::uint64_t address) {
    const std::uint32_t* found = starts_.find(address);
    if (found == nullptr) return;
    // A released segment is one free block; a damaged trace may leave more.
    std::uint32_t id = *found;
    while (blocks_[id].prev != kNone) id = blocks_[id].prev;
    while (id != kNone) {
      const std::uint32_t next = blocks_[id].next;
      forget(id);
      id = next;
    }
  }

  void segment_map(std::uint64_t address, std::uint64_t size) {
    if (size == 0) return;
    const std::uint32_t id = new_block(address, size, false, true);
    starts_.insert(address, id);
    ends_.insert(address + size, id);
    if (const std::uint32_t* before = ends_.find(address); before != nullptr && *before != id) link(*before, id);
    if (const std::uint32_t* after = starts_.find(address + size); after != nullptr && blocks_[*after].expandable)
      link(id, *after);
    merge_with_neighbours(id);
  }

  void segment_unmap(std::uint64_t address, std::uint64_t size) {
    const std::uint64_t end = address + size;
    for (std::uint32_t id = 0; id < blocks_.size(); ++id) {
      Node& b = blocks_[id];
      if (!b.live || !b.expandable || !b.free || address < b.start || end > b.start + b.size) continue;
      // [b.start, address) stays free, [address, end) goes, [end, b's end) stays free.
      const std::uint64_t block_end = b.start + b.size;
      const std::uint32_t next = b.next;
      if (end < block_end) {
        const std::uint32_t tail = new_block(end, block_end - end, false, true);
        starts_.insert(end, tail);
        ends_.insert(block_end, tail);
        if (next != kNone) link(tail, next);
      } else if (next != kNone) {
        blocks_[next].prev = kNone;
      }
      blocks_[id].next = kNone;
      if (address > blocks_[id].start) {
        ends_.erase(block_end);
        blocks_[id].size = address - blocks_[id].start;
        ends_.insert(address, id);
      } else {
        if (blocks_[id].prev != kNone) blocks_[blocks_[id].prev].next = kNone;
        blocks_[id].prev = kNone;
        forget(id);
      }
      return;
    }
  }

  // The size of the block an allocation at `address` received, its request
  // rounded to `rounded` (pytorch_round_size), or nullopt when no free block
  // of at least that size starts there.
  std::optional<std::uint64_t> alloc(std::uint64_t address, std::uint64_t rounded) {
    const std::uint32_t* found = starts_.find(address);
    if (found == nullptr) return std::nullopt;
    const std::uint32_t id = *found;
    Node& b = blocks_[id];
    if (!b.free || b.size < rounded) return std::nullopt;
    const std::uint64_t remaining = b.size - rounded;
    const bool split = b.small || b.expandable || policy_.expandable_segments
                           ? remaining >= kMinBlockSize
                           : rounded < policy_.max_split_size && remaining > kSmallSize;
    b.free = false;
    if (!split) return b.size;
    const std::uint64_t old_end = b.start + b.size;
    const std::uint32_t next = b.next;
    const bool small = b.small;
    const bool expandable = b.expandable;
    b.size = rounded;
    const std::uint32_t tail = new_block(address + rounded, remaining, small, expandable);
    starts_.insert(address + rounded, tail);
    if (expandable) {
      ends_.insert(address + rounded, id);
      ends_.insert(old_end, tail);
    }
    link(id, tail);
    if (next != kNone) link(tail, next);
    return rounded;
  }

  void free_completed(std::uint64_t address) {
    const std::uint32_t* found = starts_.find(address);
    if (found == nullptr || blocks_[*found].free) return;
    blocks_[*found].free = true;
    merge_with_neighbours(*found);
  }

 private:
  static constexpr std::uint32_t kNone = 0xffffffffu;
  static constexpr std::uint64_t kMinBlockSize = 512;
  static constexpr std::uint64_t kSmallSize = 1 << 20;

  struct Node {
    std::uint64_t start = 0;
    std::uint64_t size = 0;
    std::uint32_t prev = kNone;
    std::uint32_t next = kNone;
    bool free = true;
    bool small = false;
    bool expandable = false;
    bool live = false;
  };

  std::uint32_t new_block(std::uint64_t start, std::uint64_t size, bool small, bool expandable) {
    std::uint32_t id;
    if (!spare_.empty()) {
      id = spare_.back();
      spare_.pop_back();
    } else {
      id = static_cast<std::uint32_t>(blocks_.size());
      blocks_.emplace_back();
    }
    blocks_[id] = Node{start, size, kNone, kNone, true, small, expandable, true};
    return id;
  }

  void link(std::uint32_t left, std::uint32_t right) {
    blocks_[left].next = right;
    blocks_[right].prev = left;
  }

  // Drops a block that is no longer linked to anything that stays.
  void forget(std::uint32_t id) {
    Node& b = blocks_[id];
    starts_.erase(b.start);
    if (b.expandable) {
      const std::uint32_t* at_end = ends_.find(b.start + b.size);
      if (at_end != nullptr && *at_end == id) ends_.erase(b.start + b.size);
    }
    b.live = false;
    spare_.push_back(id);
  }

  // `left` absorbs its free right neighbour.
  void absorb_next(std::uint32_t left) {
    const std::uint32_t right = blocks_[left].next;
    Node& l = blocks_[left];
    const Node r = blocks_[right];
    if (l.expandable) ends_.erase(l.start + l.size);
    l.size += r.size;
    l.next = r.next;
    if (r.next != kNone) blocks_[r.next].prev = left;
    starts_.erase(r.start);
    if (r.expandable) ends_.insert(r.start + r.size, left);
    blocks_[right].live = false;
    spare_.push_back(right);
  }

  void merge_with_neighbours(std::uint32_t id) {
    if (blocks_[id].next != kNone && blocks_[blocks_[id].next].free) absorb_next(id);
    if (blocks_[id].prev != kNone && blocks_[blocks_[id].prev].free) absorb_next(blocks_[id].prev);
  }

  BlockPolicy policy_;
  std::vector<Node> blocks_;
  std::vector<std::uint32_t> spare_;
  FlatMap<std::uint32_t> starts_;  // block start -> block
  FlatMap<std::uint32_t> ends_;    // block end -> block, expandable segments only
};

// PyTorch's trace names no pool for a segment_alloc. The reader gives it
// the pool of the final layout's segment at its address where that segment
// has the same size (it survived whole), else the pool its size implies:
// small-pool segments are 2 MiB. The pickle writer names the segments this
// rule gets wrong as a loss.
inline constexpr std::uint64_t kSmallPoolSegmentBytes = 2ull << 20;
inline bool trace_segment_is_large(const Segment* at_address, std::uint64_t size) noexcept {
  return at_address != nullptr && at_address->total_size == size ? at_address->large_pool
                                                                   : size > kSmallPoolSegmentBytes;
}

// What the inference needs besides the events.
struct BlockSizeInput {
  BlockPolicy policy;
  // The final layout of the trace's device (the snapshot's 'segments').
  std::span<const Segment* const> segments;
  // Also raise each event's time to at least the one before.
  bool clamp_time = false;
  // Threads for the per-segment pass (below); 1 runs the one-thread pass.
  unsigned threads = 1;
  // The fewest events for the per-segment pass to start threads.
  std::size_t min_parallel_events = std::size_t{1} << 16;
};

// How the sizes were found (the snapshot's block_sizes.* settings).
struct BlockSizeFacts {
  std::uint64_t inferred = 0;      // allocations the layout could not explain: their rounded request
  std::uint64_t contradicted = 0;  // exact sizes the final layout contradicts
  bool begins_mid_run = false;     // a free or release of something the trace never made
  bool per_segment = false;        // the per-segment pass gave the answer (else the one-thread pass)
};

// Gives each alloc and free of one device's trace the size of its block, and
// each segment_alloc and segment_map its pool flags, in place. In order of
// trust: the final layout's block for an allocation still alive at the end;
// BlockSizer's block; the rounded request.
//
// With threads, the trace is first cut by segment: while a segment lives,
// only its own allocations change its blocks, so each segment's events are
// sized on their own, side by side (the usual trace: 3M events over a few
// dozen segments). Where that does not hold — expandable segments, an
// allocation or free outside every segment the trace made, segments that
// overlap, a segment released with blocks still allocated, a free of a
// block never allocated — the one-thread pass sizes the whole trace, so the
// answer is always the one-thread pass's. Fields other than the sizes, the
// segments' flags and (with clamp_time) the times are never written.
BlockSizeFacts infer_block_sizes(std::vector<Event>& events, const BlockSizeInput& input);

}  // namespace cachealloc::snapshot::detail
