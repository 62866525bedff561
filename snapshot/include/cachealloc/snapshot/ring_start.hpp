// The allocator layout at the start of the history ring: what the events lost
// to an overflow had built, derived from the final layout and the events that
// remain. Format version 4 stores it (Snapshot::ring_start), so the analyzer
// reads it instead of decoding every block twice; the analyzer also derives
// it itself for older files, through the same functions.
//
// The derivation walks the events backwards from the final layout, as
// PyTorch's MemoryViz does: a free undone brings its block back, an alloc
// undone removes it, a release undone brings its segment back, a map undone
// unmaps its range. Gaps between active blocks become inactive blocks, which
// is exact because the allocator always merges free neighbours. A block that
// the events contradict (one that overlaps another, or lies in no segment)
// is counted in RingStart::unplaced_blocks and left out.
//
// Thread safety: reentrant; the functions share no state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::snapshot {

// Block `block` of a trace's events, oldest event first within the block.
// The span must stay valid until the next call.
using EventBlock = std::function<std::span<const Event>(std::size_t block)>;

// The layout of `device` just before the first event, from `final_layout`
// (Snapshot::segments; other devices' segments are skipped) and the events,
// which `block` hands over one block at a time, asked for from block
// `block_count - 1` down to block 0 (each once), so a file streams through
// one block of memory. Events of other devices are skipped.
// Cost: O(events + final blocks) time, O(live blocks + segments) memory
// besides the block in hand. Throws only what `block` throws (and bad_alloc).
RingStart derive_ring_start(const std::vector<Segment>& final_layout, std::int32_t device, std::size_t block_count,
                            const EventBlock& block);
// The same over events already in memory.
RingStart derive_ring_start(const std::vector<Segment>& final_layout, std::int32_t device,
                            std::span<const Event> events);

// What the writer stores as Snapshot::ring_start: one entry per device that
// a non-annotation event, a segment or a DeviceInfo names, sorted by device
// (so the analyzer finds an entry whichever device it picks), derived from
// snapshot.segments and snapshot.events. Empty when dropped_events == 0: a
// ring that never overflowed starts from what the analyzer tries first, the
// empty allocator. Cost: one backward pass over the events per device.
std::vector<RingStart> derive_ring_starts(const Snapshot& snapshot);

// The stored start of `device` in snapshot.ring_start, or nullptr.
const RingStart* find_ring_start(const Snapshot& snapshot, std::int32_t device) noexcept;

}  // namespace cachealloc::snapshot
