#include "cachealloc/analyzer/replay.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "cachealloc/analyzer/detail/flat_hash.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/policy.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/pickle.hpp"
#include "cachealloc/snapshot/ring_start.hpp"
#include "core/replay_hot.hpp"

namespace cachealloc::analyzer {

using snapshot::BlockState;
using snapshot::Event;
using snapshot::EventKind;
using snapshot::Segment;
using snapshot::StackId;
using snapshot::StringId;

namespace {

bool is_active(BlockState state) noexcept {
  return state == BlockState::active_allocated || state == BlockState::active_pending_free;
}

std::uint64_t minus(std::uint64_t a, std::uint64_t b) noexcept { return a > b ? a - b : 0; }

}  // namespace

// ---------------------------------------------------------------------------
// The layout before the ring.

namespace {

constexpr std::uint64_t kSmallRequest = std::uint64_t{1} << 20;  // the small pool's largest request

// Only where block sizes may be inferred (Replay::sizes_may_be_inferred):
// our own files' sizes are the allocator's, and a test's layout need not
// follow PyTorch's policy.
InitialLayout joined(InitialLayout layout) {
  layout.joined_fragments = join_impossible_fragments(layout.segments);
  return layout;
}

}  // namespace

std::uint64_t join_impossible_fragments(std::vector<snapshot::Segment>& segments) {
  std::uint64_t joined = 0;
  for (auto& segment : segments) {
    if (!segment.large_pool || segment.expandable) continue;
    auto& blocks = segment.blocks;
    for (std::size_t i = 1; i < blocks.size();) {
      if (blocks[i].state == snapshot::BlockState::inactive && blocks[i].size <= kSmallRequest &&
          blocks[i - 1].state != snapshot::BlockState::inactive) {
        blocks[i - 1].size += blocks[i].size;
        blocks.erase(blocks.begin() + static_cast<std::ptrdiff_t>(i));
        ++joined;
      } else {
        ++i;
      }
    }
  }
  return joined;
}

InitialLayout derive_initial_layout(const snapshot::Snapshot& snapshot, std::int32_t device) {
  InitialLayout layout = snapshot::derive_ring_start(snapshot.segments, device, snapshot.events);
  return Replay::sizes_may_be_inferred(snapshot, device) ? joined(std::move(layout)) : layout;
}

InitialLayout derive_initial_layout(EventSource& source, std::int32_t device) {
  InitialLayout layout = snapshot::derive_ring_start(source.head().segments, device, source.block_count(),
                                                     [&](std::size_t block) { return source.block(block); });
  return Replay::sizes_may_be_inferred(source.head(), device) ? joined(std::move(layout)) : layout;
}

// ---------------------------------------------------------------------------
// The forward engine.

bool Replay::sizes_may_be_inferred(const snapshot::Snapshot& head, std::int32_t device) noexcept {
  if (head.header.source != "pytorch-pickle") return false;
  try {
    return snapshot::block_size_count(head, snapshot::kInferredBlockSizesSetting, device) != 0;
  } catch (...) {
    return true;  // out of memory for the key: the cautious answer
  }
}

Replay::Replay(const std::vector<Segment>& initial, std::int32_t device, std::size_t stack_count,
               bool inferred_sizes)
    : device_(device),
      inferred_sizes_(inferred_sizes),
      live_bytes_by_stack_(std::max<std::size_t>(stack_count, 1), 0),
      live_blocks_by_stack_(std::max<std::size_t>(stack_count, 1), 0) {
  load(initial);
  if (impossible(totals_)) refuse_impossible_state(true);
}

Replay::~Replay() = default;

void Replay::refuse_impossible_state(bool initial) const {
  const Totals& t = totals_;
  const std::string where =
      initial ? std::string("the layout before the first event") : "replaying event " + std::to_string(applied_);
  throw snapshot::SnapshotError(
      snapshot::ErrorCode::inconsistent,
      "inconsistent snapshot: " + where + " gives an impossible state on device " + std::to_string(device_) +
          ": allocated " + std::to_string(t.allocated) + ", active " + std::to_string(t.active) +
          ", inactive_split " + std::to_string(t.inactive_split) + ", requested " + std::to_string(t.requested) +
          ", reserved " + std::to_string(t.reserved) + " bytes");
}

void Replay::load(const std::vector<Segment>& initial) {
  for (const Segment& segment : initial) {
    if (segment.device != device_ || segment.total_size == 0) continue;
    const std::uint32_t sid = new_segment();
    SegmentNode& s = segments_[sid];
    s.address = segment.address;
    s.total_size = segment.total_size;
    s.stream = segment.stream;
    s.large_pool = segment.large_pool;
    s.expandable = segment.expandable;
    any_expandable_ = any_expandable_ || segment.expandable;
    s.stack = segment.stack;
    segment_at_.insert(segment.address, sid);
    std::vector<snapshot::Block> blocks = segment.blocks;
    if (blocks.empty()) blocks.push_back(snapshot::Block{segment.address, segment.total_size, 0, BlockState::inactive, {}});
    std::uint32_t previous = kNone;
    for (const snapshot::Block& block : blocks) {
      const std::uint32_t bid = new_block();
      BlockNode& b = blocks_[bid];
      b.address = block.address;
      b.size = block.size;
      b.requested = block.requested;
      b.state = block.state;
      b.stack = block.stack;
      b.segment = sid;
      b.prev = previous;
      if (previous == kNone) {
        segments_[sid].first_block = bid;
      } else {
        blocks_[previous].next = bid;
      }
      previous = bid;
      block_at_.insert(block.address, bid);
      SegmentNode& seg = segments_[sid];
      ++seg.block_count;
      if (block.state != BlockState::unmapped) seg.mapped += block.size;
      switch (block.state) {
        case BlockState::active_allocated:
          seg.allocated += block.size;
          totals_.allocated += block.size;
          add_live(block.stack, block.size);
          [[fallthrough]];
        case BlockState::active_pending_free:
          seg.requested += block.requested;
          totals_.requested += block.requested;
          seg.active += block.size;
          ++seg.active_blocks;
          totals_.active += block.size;
          break;
        case BlockState::inactive:
          seg.inactive += block.size;
          break;
        case BlockState::unmapped:
          break;
      }
    }
    totals_.reserved += segments_[sid].mapped;
    if (!segments_[sid].expandable) ++totals_.segments;
    segment_enter(segments_[sid]);
  }
  last_touched_stack_ = kNone;
}

void Replay::apply(const Event& event) { apply_inline(event); }

void Replay::on_segment_alloc(std::uint64_t address, std::uint64_t size, std::uint64_t stream, bool large_pool,
                              bool expandable, StackId stack) {
  if (segment_at_.find(address) != kNone) {
    ++anomalies_.unknown_segment;
    on_segment_release(address);
  }
  if (size == 0) return;
  for (const SegmentNode& other : segments_) {  // O(segments), per segment_alloc only
    const bool overlaps = (address >= other.address && address - other.address < other.total_size) ||
                          (other.address >= address && other.address - address < size);
    if (other.live && overlaps) {
      ++overlapping_segments_;
      break;
    }
  }
  const std::uint32_t sid = new_segment();
  const std::uint32_t bid = new_block();
  SegmentNode& s = segments_[sid];
  s.address = address;
  s.total_size = size;
  s.stream = stream;
  s.large_pool = large_pool;
  s.expandable = expandable;
  any_expandable_ = any_expandable_ || expandable;
  s.stack = stack;
  s.mapped = size;
  s.inactive = size;
  s.first_block = bid;
  s.block_count = 1;
  BlockNode& b = blocks_[bid];
  b.address = address;
  b.size = size;
  b.segment = sid;
  segment_at_.insert(address, sid);
  block_at_.insert(address, bid);
  totals_.reserved += size;
  if (!expandable) ++totals_.segments;
  segment_enter(s);
}

void Replay::on_segment_release(std::uint64_t address) {
  const std::uint32_t sid = segment_at_.find(address);
  if (sid == kNone) {
    ++anomalies_.unknown_segment;
    return;
  }
  SegmentNode& s = segments_[sid];
  segment_leave(s);
  if (s.active_blocks != 0) ++anomalies_.segment_released_with_active_blocks;
  for (std::uint32_t id = s.first_block; id != kNone;) {
    const BlockNode& b = blocks_[id];
    if (b.state == BlockState::active_allocated) {
      totals_.allocated -= b.size;
      remove_live(b.stack, b.size);
    }
    if (is_active(b.state)) {
      totals_.active -= b.size;
      totals_.requested -= b.requested;
    }
    const std::uint32_t next = b.next;
    drop_block(id);
    id = next;
  }
  totals_.reserved -= s.mapped;
  if (!s.expandable) --totals_.segments;
  s.live = false;
  segment_at_.erase(address);
  free_segments_.push_back(sid);
}

void Replay::on_segment_map(const Event& event) {
  const std::uint64_t address = event.address;
  const std::uint64_t size = event.size;
  std::uint32_t sid = segment_containing(address);
  if (sid == kNone) {
    for (std::uint32_t i = 0; i < segments_.size(); ++i) {
      if (segments_[i].live && segments_[i].address + segments_[i].total_size == address) sid = i;
    }
    if (sid == kNone) {
      // Flags say the pool where the writer knew it (our recorder always,
      // the pickle reader from the final layout); a map without them is
      // taken for the large pool, where most expandable memory lives.
      const bool flagged = (event.aux & snapshot::segment_flag_expandable) != 0;
      const bool large = !flagged || (event.aux & snapshot::segment_flag_large_pool) != 0;
      on_segment_alloc(address, size, event.stream, large, true, event.stack);
      return;
    }
    // Grow the segment at its end.
    std::uint32_t last = segments_[sid].first_block;
    while (blocks_[last].next != kNone) last = blocks_[last].next;
    const std::uint32_t bid = new_block();
    BlockNode& b = blocks_[bid];
    b.address = address;
    b.size = size;
    b.segment = sid;
    b.prev = last;
    blocks_[last].next = bid;
    block_at_.insert(address, bid);
    SegmentNode& s = segments_[sid];
    segment_leave(s);
    ++s.block_count;
    s.total_size += size;
    s.mapped += size;
    s.inactive += size;
    s.largest_free_stale = s.free_chunks_stale = true;
    coalesce(bid);
    segment_enter(s);
    totals_.reserved += size;
    return;
  }
  const std::uint32_t id = isolate(sid, address, size, BlockState::unmapped);
  if (id == kNone) {
    ++anomalies_.unknown_segment;
    return;
  }
  SegmentNode& s = segments_[sid];
  segment_leave(s);
  blocks_[id].state = BlockState::inactive;
  s.mapped += size;
  s.inactive += size;
  s.largest_free_stale = s.free_chunks_stale = true;
  coalesce(id);
  segment_enter(s);
  totals_.reserved += size;
}

void Replay::on_segment_unmap(std::uint64_t address, std::uint64_t size) {
  const std::uint32_t sid = segment_containing(address);
  const std::uint32_t id = sid == kNone ? kNone : isolate(sid, address, size, BlockState::inactive);
  if (id == kNone) {
    ++anomalies_.unknown_segment;
    return;
  }
  SegmentNode& s = segments_[sid];
  segment_leave(s);
  blocks_[id].state = BlockState::unmapped;
  s.mapped -= size;
  s.inactive -= size;
  s.largest_free_stale = s.free_chunks_stale = true;
  coalesce(id);
  segment_enter(s);
  totals_.reserved -= size;
}

void Replay::on_annotation_end(StringId name) {
  for (auto it = annotations_.rbegin(); it != annotations_.rend(); ++it) {
    if (*it == name) {
      annotations_.erase(std::next(it).base());
      return;
    }
  }
}

std::uint32_t Replay::new_segment() {
  std::uint32_t id;
  if (!free_segments_.empty()) {
    id = free_segments_.back();
    free_segments_.pop_back();
    segments_[id] = SegmentNode{};
  } else {
    id = static_cast<std::uint32_t>(segments_.size());
    segments_.emplace_back();
  }
  segments_[id].live = true;
  return id;
}

std::uint32_t Replay::segment_containing(std::uint64_t address) const {
  // Allocations come in runs into one segment (PyTorch's traces reach here
  // on every alloc): try the last one found before scanning them all.
  auto holds = [&](std::uint32_t i) {
    const SegmentNode& s = segments_[i];
    return s.live && address >= s.address && address - s.address < s.total_size;
  };
  if (last_segment_ < segments_.size() && holds(last_segment_)) return last_segment_;
  for (std::uint32_t i = 0; i < segments_.size(); ++i) {
    if (holds(i)) {
      last_segment_ = i;
      return i;
    }
  }
  return kNone;
}

std::uint32_t Replay::isolate(std::uint32_t segment, std::uint64_t address, std::uint64_t size, BlockState expected) {
  std::uint32_t id = segments_[segment].first_block;
  while (id != kNone && blocks_[id].address + blocks_[id].size <= address) id = blocks_[id].next;
  if (id == kNone || blocks_[id].address > address || blocks_[id].state != expected ||
      address + size > blocks_[id].address + blocks_[id].size) {
    return kNone;
  }
  if (blocks_[id].address < address) id = split_block(id, address);
  if (blocks_[id].size > size) split_block(id, address + size);
  segments_[segment].largest_free_stale = segments_[segment].free_chunks_stale = true;
  return id;
}

std::uint64_t Replay::largest_free_of(const SegmentNode& segment) const {
  if (segment.largest_free_stale) {
    std::uint64_t largest = 0;
    for (std::uint32_t id = segment.first_block; id != kNone; id = blocks_[id].next) {
      if (blocks_[id].state == BlockState::inactive) largest = std::max(largest, blocks_[id].size);
    }
    segment.largest_free = largest;
    segment.largest_free_stale = false;
  }
  return segment.largest_free;
}

// PyTorch's empty_cache() releases every segment without an active block
// and, in an expandable segment that still holds some, unmaps the whole
// chunks inside each free block (unmap_block: from the first chunk boundary
// at or after the block's start to the last at or before its end). Chunks
// are 2 MiB in the small pool and 20 MiB in the large, counted from the
// segment's start, which is a chunk boundary: memory is mapped in whole
// chunks. The same rule as our allocator's (allocator_expandable.cpp).
std::uint64_t Replay::releasable_of(const SegmentNode& segment) const {
  if (segment.active_blocks == 0) return segment.inactive;
  if (!segment.expandable) return 0;
  if (segment.free_chunks_stale) {
    // The mapping granularity of PyTorch's expandable segments.
    const std::uint64_t chunk = segment.large_pool ? kLargeBuffer : kSmallBuffer;
    std::uint64_t total = 0;
    for (std::uint32_t id = segment.first_block; id != kNone; id = blocks_[id].next) {
      const BlockNode& b = blocks_[id];
      if (b.state != BlockState::inactive || b.address < segment.address) continue;
      const std::uint64_t first = (b.address - segment.address + chunk - 1) / chunk;
      const std::uint64_t last = (b.address + b.size - segment.address) / chunk;
      if (last > first) total += (last - first) * chunk;
    }
    segment.free_chunks = total;
    segment.free_chunks_stale = false;
  }
  return segment.free_chunks;
}

CacheFigures Replay::cache_figures(bool with_largest_free) const {
  CacheFigures f;
  f.pending_free = minus(totals_.active, totals_.allocated);
  f.cached_free = minus(totals_.reserved, totals_.active);
  f.releasable = cached_unsplit_;
  // Segments without an active block are in cached_unsplit_ already; the
  // rest count only in expandable segments, which are few: PyTorch keeps
  // one per stream and pool.
  if (any_expandable_) {
    for (const SegmentNode& s : segments_) {
      if (s.live && s.expandable && s.active_blocks != 0) f.releasable += releasable_of(s);
    }
  }
  f.inactive_split = totals_.inactive_split;
  f.rounding_waste = minus(totals_.active, totals_.requested);
  if (!with_largest_free) return f;
  for (const SegmentNode& s : segments_) {
    if (s.live) f.largest_free = std::max(f.largest_free, largest_free_of(s));
  }
  return f;
}

std::vector<SegmentFigures> Replay::segment_figures() const {
  std::vector<SegmentFigures> result;
  for (const SegmentNode& s : segments_) {
    if (!s.live) continue;
    result.push_back(SegmentFigures{s.address, s.total_size, s.mapped, s.allocated, s.requested, s.active, s.inactive,
                                    largest_free_of(s), s.block_count, s.active_blocks, s.large_pool, s.expandable,
                                    s.stream, releasable_of(s)});
  }
  std::sort(result.begin(), result.end(),
            [](const SegmentFigures& a, const SegmentFigures& b) { return a.address < b.address; });
  return result;
}

std::vector<Segment> Replay::layout() const {
  std::vector<Segment> result;
  for (const SegmentNode& s : segments_) {
    if (!s.live) continue;
    Segment segment{device_, s.stream, s.address, s.total_size, s.large_pool, s.expandable, s.stack, {}};
    segment.blocks.reserve(s.block_count);
    for (std::uint32_t id = s.first_block; id != kNone; id = blocks_[id].next) {
      const BlockNode& b = blocks_[id];
      segment.blocks.push_back(snapshot::Block{b.address, b.size, b.requested, b.state, b.stack});
    }
    result.push_back(std::move(segment));
  }
  std::sort(result.begin(), result.end(), [](const Segment& a, const Segment& b) { return a.address < b.address; });
  return result;
}

}  // namespace cachealloc::analyzer
