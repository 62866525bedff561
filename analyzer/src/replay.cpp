#include "cachealloc/analyzer/replay.hpp"

#include <algorithm>
#include <map>
#include <utility>

#include "cachealloc/analyzer/detail/flat_hash.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "replay_hot.hpp"

namespace cachealloc::analyzer {

using snapshot::BlockState;
using snapshot::Event;
using snapshot::EventKind;
using snapshot::Segment;
using snapshot::StackId;
using snapshot::StringId;

namespace {

constexpr std::uint64_t kSmallPoolSegmentSize = 2ull << 20;

bool is_active(BlockState state) noexcept {
  return state == BlockState::active_allocated || state == BlockState::active_pending_free;
}

std::uint64_t minus(std::uint64_t a, std::uint64_t b) noexcept { return a > b ? a - b : 0; }

}  // namespace

// ---------------------------------------------------------------------------
// The layout before the ring.

InitialLayout derive_initial_layout(const snapshot::Snapshot& snapshot, std::int32_t device) {
  SnapshotEvents source(snapshot);
  return derive_initial_layout(source, device);
}

InitialLayout derive_initial_layout(EventSource& source, std::int32_t device) {
  const snapshot::Snapshot& snapshot = source.head();
  struct SegmentInfo {
    std::uint64_t total_size = 0;
    std::uint64_t stream = 0;
    bool large_pool = false;
    bool expandable = false;
    StackId stack{};
    std::vector<std::pair<std::uint64_t, std::uint64_t>> unmapped;  // [begin, end)
  };
  struct BlockInfo {
    std::uint64_t address = 0;
    std::uint64_t size = 0;
    std::uint64_t requested = 0;
    StackId stack{};
    BlockState state = BlockState::active_allocated;
    bool from_event = false;
    bool live = false;
  };
  // Segments are few; an ordered map keeps the containing-range lookups simple.
  std::map<std::uint64_t, SegmentInfo> segments;
  std::vector<BlockInfo> blocks;
  std::vector<std::uint32_t> free_ids;
  detail::FlatHashMap block_at;

  auto put_block = [&](const BlockInfo& info) {
    std::uint32_t id = block_at.find(info.address);
    if (id == detail::FlatHashMap::kMissing) {
      if (!free_ids.empty()) {
        id = free_ids.back();
        free_ids.pop_back();
      } else {
        id = static_cast<std::uint32_t>(blocks.size());
        blocks.emplace_back();
      }
      block_at.insert(info.address, id);
    }
    blocks[id] = info;
    blocks[id].live = true;
    return id;
  };

  for (const Segment& segment : snapshot.segments) {
    if (segment.device != device) continue;
    SegmentInfo info{segment.total_size, segment.stream, segment.large_pool, segment.expandable, segment.stack, {}};
    for (const snapshot::Block& block : segment.blocks) {
      if (block.state == BlockState::unmapped) {
        info.unmapped.emplace_back(block.address, block.address + block.size);
      } else if (is_active(block.state)) {
        put_block(BlockInfo{block.address, block.size, block.requested, block.stack, block.state, false, true});
      }
    }
    segments[segment.address] = std::move(info);
  }

  auto containing = [&](std::uint64_t address) {
    auto it = segments.upper_bound(address);
    if (it == segments.begin()) return segments.end();
    --it;
    return address < it->first + it->second.total_size ? it : segments.end();
  };

  // The block the last free_completed put, while it stays at that address.
  std::uint64_t last_put_address = 0;
  std::uint32_t last_put_id = detail::FlatHashMap::kMissing;
  for (std::size_t block_index = source.block_count(); block_index-- > 0;) {
    const std::span<const Event> block = source.block(block_index);
    for (auto e = block.rbegin(); e != block.rend(); ++e) {
      if (e->device != device) continue;
      switch (e->kind) {
        case EventKind::alloc: {
          const std::uint32_t id = block_at.find(e->address);
          if (id == last_put_id) last_put_id = detail::FlatHashMap::kMissing;
          if (id != detail::FlatHashMap::kMissing) {
            block_at.erase(e->address);
            blocks[id].live = false;
            free_ids.push_back(id);
          }
          break;
        }
        case EventKind::free_requested: {
          // Walking backwards, a free_requested mostly comes right after
          // (before, in time) its block's free_completed: skip the lookup.
          const std::uint32_t id = e->address == last_put_address && last_put_id != detail::FlatHashMap::kMissing
                                       ? last_put_id
                                       : block_at.find(e->address);
          if (id != detail::FlatHashMap::kMissing) {
            blocks[id].state = BlockState::active_allocated;
          } else {
            put_block(BlockInfo{e->address, e->size, e->aux, e->stack, BlockState::active_allocated, true, true});
          }
          break;
        }
        case EventKind::free_completed:
          last_put_id =
              put_block(BlockInfo{e->address, e->size, e->aux, e->stack, BlockState::active_pending_free, true, true});
          last_put_address = e->address;
          break;
        case EventKind::segment_alloc:
          segments.erase(e->address);
          break;
        case EventKind::segment_release:
          // The release carries no flags; a small-pool segment is always exactly 2 MiB.
          segments[e->address] =
              SegmentInfo{e->size, e->stream, e->size != kSmallPoolSegmentSize, false, e->stack, {}};
          break;
        case EventKind::segment_map: {
          auto it = containing(e->address);
          if (it == segments.end()) break;
          SegmentInfo& info = it->second;
          const std::uint64_t end = it->first + info.total_size;
          if (e->address == it->first && e->size >= info.total_size) {
            segments.erase(it);  // the map created this segment
          } else if (e->address + e->size >= end) {
            info.total_size = e->address - it->first;  // the map grew this segment
          } else {
            info.unmapped.emplace_back(e->address, e->address + e->size);
          }
          break;
        }
        case EventKind::segment_unmap: {
          auto it = containing(e->address);
          if (it == segments.end()) break;
          const std::uint64_t begin = e->address;
          const std::uint64_t end = e->address + e->size;
          std::vector<std::pair<std::uint64_t, std::uint64_t>> kept;
          for (auto [b, f] : it->second.unmapped) {
            if (f <= begin || b >= end) {
              kept.emplace_back(b, f);
              continue;
            }
            if (b < begin) kept.emplace_back(b, begin);
            if (f > end) kept.emplace_back(end, f);
          }
          it->second.unmapped = std::move(kept);
          break;
        }
        default:
          break;
      }
    }
  }

  InitialLayout result;
  std::vector<const BlockInfo*> live;
  live.reserve(block_at.size());
  for (const BlockInfo& block : blocks) {
    if (block.live) live.push_back(&block);
  }
  std::sort(live.begin(), live.end(), [](const BlockInfo* a, const BlockInfo* b) { return a->address < b->address; });

  std::size_t next = 0;
  for (auto& [address, info] : segments) {
    const std::uint64_t end = address + info.total_size;
    while (next < live.size() && live[next]->address < address) {
      ++result.unplaced_blocks;
      ++next;
    }
    // Active blocks and unmapped ranges, in address order; gaps become inactive.
    std::vector<snapshot::Block> pieces;
    for (; next < live.size() && live[next]->address < end; ++next) {
      const BlockInfo& b = *live[next];
      pieces.push_back(snapshot::Block{b.address, b.size, b.requested, b.state, b.stack});
      if (b.from_event) ++result.blocks_from_before_ring;
    }
    for (auto [b, f] : info.unmapped) pieces.push_back(snapshot::Block{b, f - b, 0, BlockState::unmapped, {}});
    std::sort(pieces.begin(), pieces.end(),
              [](const snapshot::Block& a, const snapshot::Block& b) { return a.address < b.address; });

    Segment segment{device, info.stream, address, info.total_size, info.large_pool, info.expandable, info.stack, {}};
    std::uint64_t cursor = address;
    for (const snapshot::Block& piece : pieces) {
      if (piece.address < cursor || piece.address + piece.size > end) {
        ++result.unplaced_blocks;  // overlaps: the trace contradicts itself
        continue;
      }
      if (piece.address > cursor)
        segment.blocks.push_back(snapshot::Block{cursor, piece.address - cursor, 0, BlockState::inactive, {}});
      segment.blocks.push_back(piece);
      cursor = piece.address + piece.size;
    }
    if (cursor < end) segment.blocks.push_back(snapshot::Block{cursor, end - cursor, 0, BlockState::inactive, {}});
    result.segments.push_back(std::move(segment));
  }
  result.unplaced_blocks += live.size() - next;
  return result;
}

// ---------------------------------------------------------------------------
// The forward engine.

Replay::Replay(const std::vector<Segment>& initial, std::int32_t device, std::size_t stack_count)
    : device_(device),
      live_bytes_by_stack_(std::max<std::size_t>(stack_count, 1), 0),
      live_blocks_by_stack_(std::max<std::size_t>(stack_count, 1), 0) {
  load(initial);
}

Replay::~Replay() = default;

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
          seg.requested += block.requested;
          totals_.allocated += block.size;
          totals_.requested += block.requested;
          add_live(block.stack, block.size);
          [[fallthrough]];
        case BlockState::active_pending_free:
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
  const std::uint32_t sid = new_segment();
  const std::uint32_t bid = new_block();
  SegmentNode& s = segments_[sid];
  s.address = address;
  s.total_size = size;
  s.stream = stream;
  s.large_pool = large_pool;
  s.expandable = expandable;
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
      totals_.requested -= b.requested;
      remove_live(b.stack, b.size);
    }
    if (is_active(b.state)) totals_.active -= b.size;
    const std::uint32_t next = b.next;
    drop_block(id);
    id = next;
  }
  totals_.reserved -= s.mapped;
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
      on_segment_alloc(address, size, event.stream, true, true, event.stack);
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
    s.largest_free_stale = true;
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
  s.largest_free_stale = true;
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
  s.largest_free_stale = true;
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
  for (std::uint32_t i = 0; i < segments_.size(); ++i) {
    const SegmentNode& s = segments_[i];
    if (s.live && address >= s.address && address - s.address < s.total_size) return i;
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
  segments_[segment].largest_free_stale = true;
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

CacheFigures Replay::cache_figures(bool with_largest_free) const {
  CacheFigures f;
  f.free_in_cache = minus(totals_.reserved, totals_.allocated);
  f.pending_free = minus(totals_.active, totals_.allocated);
  f.inactive = minus(totals_.reserved, totals_.active);
  f.cached_unsplit = cached_unsplit_;
  f.inactive_split = minus(f.inactive, cached_unsplit_);
  f.rounding_waste = minus(totals_.allocated, totals_.requested);
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
                                    s.stream});
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
