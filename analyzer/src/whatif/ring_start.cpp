// The layout at the ring's start of a trace that begins mid-run: where it
// comes from, its repair, and its rebuild in the replaying allocator.
#include <algorithm>
#include <iterator>

#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/errors.hpp"
#include "cachealloc/snapshot/ring_start.hpp"
#include "whatif/replay_parts.hpp"

namespace cachealloc::analyzer::whatif {

namespace {

constexpr std::uint64_t kSmallSize = std::uint64_t{1} << 20;  // the small pool's largest request

// A segment as the comparison sees it: its size, its pool, then each block's
// size and whether it is free, in address order.
std::vector<std::uint64_t> shape(const snapshot::Segment& segment) {
  std::vector<std::uint64_t> out{segment.total_size, segment.large_pool ? 1u : 0u};
  for (const auto& block : segment.blocks)
    out.push_back(block.size * 2 + (block.state == snapshot::BlockState::inactive));
  return out;
}

}  // namespace

// The start every report takes (confirmed_start): the stored one, else the
// empty allocator where the events explain the dump, else derived. A trace
// whose history began late (no ring overflow, no flag saying so) holds
// memory from before its first event just as a cut ring does.
InitialLayout initial_layout(EventSource& source, std::int32_t device) { return confirmed_start(source, device); }

RebuiltStart rebuild_ring_start(CachingAllocator& allocator, Device& device, RecordedStreams& streams,
                                const std::vector<snapshot::Segment>& segments) {
  std::vector<std::pair<const snapshot::Block*, void*>> built;
  std::vector<void*> spacers;
  for (const auto& segment : segments) {
    const Stream stream = streams.of(segment.stream);
    std::vector<void*> whole;
    try {
      if (segment.large_pool) {
        whole.push_back(allocator.allocate(segment.total_size, stream));
      } else {
        for (std::uint64_t at = 0; at < segment.total_size; at += kSmallSize)
          whole.push_back(allocator.allocate(kSmallSize, stream));
      }
      for (void* p : whole) allocator.deallocate(p);
      for (const auto& block : segment.blocks) {
        if (block.state != snapshot::BlockState::inactive) {
          built.emplace_back(&block, allocator.allocate(block.size, stream));
          continue;
        }
        // A free block of the small pool may exceed the small pool's
        // largest request: cut it in requests of at most 1 MiB (they
        // merge again when let go).
        const std::uint64_t piece = segment.large_pool ? block.size : kSmallSize;
        for (std::uint64_t at = 0; at < block.size; at += piece)
          spacers.push_back(allocator.allocate(std::min(piece, block.size - at), stream));
      }
    } catch (const OutOfMemoryError&) {
      throw InvalidArgument("the layout at the ring's start does not fit the replay's device");
    }
  }
  for (void* ptr : spacers) allocator.deallocate(ptr);
  RebuiltStart start;
  for (const auto& [block, ptr] : built) {
    if (block->state == snapshot::BlockState::active_allocated) {
      start.allocated.emplace_back(block->address, ptr);
    } else {
      const Stream side = device.create_stream();
      allocator.record_stream(ptr, side);
      allocator.deallocate(ptr);
      start.pending.emplace_back(block->address, side);
    }
  }
  return start;
}

std::uint64_t segments_not_rebuilt(const CachingAllocator& allocator, const std::vector<snapshot::Segment>& segments) {
  std::vector<std::vector<std::uint64_t>> wanted, got;
  for (const auto& segment : segments) wanted.push_back(shape(segment));
  for (const auto& segment : allocator.layout()) got.push_back(shape(segment));
  std::sort(wanted.begin(), wanted.end());
  std::sort(got.begin(), got.end());
  std::vector<std::vector<std::uint64_t>> missing;
  std::set_difference(wanted.begin(), wanted.end(), got.begin(), got.end(), std::back_inserter(missing));
  return missing.size();
}

}  // namespace cachealloc::analyzer::whatif
