#include "cachealloc/snapshot/ring_start.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "cachealloc/snapshot/detail/flat_map.hpp"

namespace cachealloc::snapshot {
namespace {

constexpr std::uint64_t kSmallPoolSegmentSize = 2ull << 20;
constexpr std::uint32_t kMissing = 0xffffffffu;

bool is_active(BlockState state) noexcept {
  return state == BlockState::active_allocated || state == BlockState::active_pending_free;
}

}  // namespace

RingStart derive_ring_start(const std::vector<Segment>& final_layout, std::int32_t device, std::size_t block_count,
                            const EventBlock& event_block) {
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
  detail::FlatMap<std::uint32_t> block_at;  // block address -> index in `blocks`
  auto find_block = [&](std::uint64_t address) {
    const std::uint32_t* id = block_at.find(address);
    return id == nullptr ? kMissing : *id;
  };

  auto put_block = [&](const BlockInfo& info) {
    std::uint32_t id = find_block(info.address);
    if (id == kMissing) {
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

  for (const Segment& segment : final_layout) {
    if (segment.device != device) continue;
    SegmentInfo info{segment.total_size, segment.stream, segment.large_pool, segment.expandable, segment.stack, {}};
    for (const Block& block : segment.blocks) {
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
  std::uint32_t last_put_id = kMissing;
  for (std::size_t block_index = block_count; block_index-- > 0;) {
    const std::span<const Event> block = event_block(block_index);
    for (auto e = block.rbegin(); e != block.rend(); ++e) {
      if (e->device != device) continue;
      switch (e->kind) {
        case EventKind::alloc: {
          const std::uint32_t id = find_block(e->address);
          if (id == last_put_id) last_put_id = kMissing;
          if (id != kMissing) {
            block_at.erase(e->address);
            blocks[id].live = false;
            free_ids.push_back(id);
          }
          break;
        }
        case EventKind::free_requested: {
          // Walking backwards, a free_requested mostly comes right after
          // (before, in time) its block's free_completed: skip the lookup.
          const std::uint32_t id = e->address == last_put_address && last_put_id != kMissing
                                       ? last_put_id
                                       : find_block(e->address);
          if (id != kMissing) {
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
          if (it == segments.end()) {
            // The range was mapped before the unmap, in no segment of the
            // layout after it (PyTorch lists an expandable segment once per
            // mapped range): it is mapped again here, as a range of its own
            // or the growth of the mapped range it touches.
            const bool large = (e->aux & segment_flag_large_pool) != 0;
            auto grown = containing(e->address - 1);
            if (e->address != 0 && grown != segments.end() && grown->second.expandable &&
                grown->first + grown->second.total_size == e->address) {
              grown->second.total_size += e->size;
            } else {
              grown = segments.insert_or_assign(e->address, SegmentInfo{e->size, e->stream, large, true, e->stack, {}}).first;
            }
            // The range that follows joins it (not the range itself: an
            // unmap of 0 bytes ends where it begins).
            if (const auto after = segments.find(e->address + e->size);
                after != segments.end() && after != grown && after->second.expandable) {
              grown->second.total_size += after->second.total_size;
              for (const auto& gap : after->second.unmapped) grown->second.unmapped.push_back(gap);
              segments.erase(after);
            }
            break;
          }
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

  RingStart result;
  result.device = device;
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
    std::vector<Block> pieces;
    for (; next < live.size() && live[next]->address < end; ++next) {
      const BlockInfo& b = *live[next];
      pieces.push_back(Block{b.address, b.size, b.requested, b.state, b.stack});
      if (b.from_event) ++result.blocks_from_before_ring;
    }
    // Only an expandable segment unmaps part of its range (invariants.hpp):
    // a map or unmap inside another contradicts the trace, and its range
    // stays an inactive gap.
    if (info.expandable)
      for (auto [b, f] : info.unmapped) pieces.push_back(Block{b, f - b, 0, BlockState::unmapped, {}});
    std::sort(pieces.begin(), pieces.end(),
              [](const Block& a, const Block& b) { return a.address < b.address; });

    Segment segment{device, info.stream, address, info.total_size, info.large_pool, info.expandable, info.stack, {}};
    std::uint64_t cursor = address;
    for (const Block& piece : pieces) {
      if (piece.address < cursor || piece.address + piece.size > end) {
        ++result.unplaced_blocks;  // overlaps: the trace contradicts itself
        continue;
      }
      if (piece.address > cursor)
        segment.blocks.push_back(Block{cursor, piece.address - cursor, 0, BlockState::inactive, {}});
      segment.blocks.push_back(piece);
      cursor = piece.address + piece.size;
    }
    if (cursor < end) segment.blocks.push_back(Block{cursor, end - cursor, 0, BlockState::inactive, {}});
    result.segments.push_back(std::move(segment));
  }
  result.unplaced_blocks += live.size() - next;
  return result;
}

RingStart derive_ring_start(const std::vector<Segment>& final_layout, std::int32_t device,
                            std::span<const Event> events) {
  return derive_ring_start(final_layout, device, events.empty() ? 0 : 1,
                           [&](std::size_t) { return events; });
}

std::vector<RingStart> derive_ring_starts(const Snapshot& snapshot) {
  std::vector<RingStart> result;
  if (snapshot.dropped_events == 0) return result;
  std::set<std::int32_t> devices;
  for (const DeviceInfo& info : snapshot.devices) devices.insert(info.index);
  for (const Segment& segment : snapshot.segments) devices.insert(segment.device);
  for (const Event& event : snapshot.events) {
    // Annotations belong to the whole program, not to the device they carry.
    if (event.kind != EventKind::annotation_begin && event.kind != EventKind::annotation_end)
      devices.insert(event.device);
  }
  for (const std::int32_t device : devices)
    result.push_back(derive_ring_start(snapshot.segments, device, std::span<const Event>(snapshot.events)));
  return result;
}

const RingStart* find_ring_start(const Snapshot& snapshot, std::int32_t device) noexcept {
  const auto it = std::lower_bound(snapshot.ring_start.begin(), snapshot.ring_start.end(), device,
                                   [](const RingStart& start, std::int32_t d) { return start.device < d; });
  return it != snapshot.ring_start.end() && it->device == device ? &*it : nullptr;
}

}  // namespace cachealloc::snapshot
