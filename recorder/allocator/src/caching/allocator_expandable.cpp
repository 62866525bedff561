// Expandable segments: one address range per stream and pool, reserved once
// and backed with memory chunk by chunk (2 MiB small pool, 20 MiB large
// pool), so that a growing workload tiles one segment instead of leaving
// slivers in many. Same rules as PyTorch's expandable_segments:True.
#include <algorithm>

#include "allocator_impl.hpp"

namespace cachealloc {

using events::EventKind;

namespace {
bool allocatable(const Block* b) {
  return b && !b->allocated && b->event_count == 0 && b->stream_uses.empty();
}
}  // namespace

// Maps enough memory at the lowest possible address of this stream's
// expandable segment to hold `size` bytes, and returns the free block that
// covers it (out of the free set). nullptr when the device is out of memory.
Block* CachingAllocator::Impl::allocate_expandable(Shard& shard, bool small, std::size_t size) {
  Block* candidate = find_expandable_block(shard, small, size);
  if (!candidate->mapped) {
    candidate = map_block(candidate, std::min(candidate->size, size));
    if (!candidate) return nullptr;
  }
  while (candidate->size < size) {
    // Invariant: a free mapped block is followed by an unmapped one here.
    Block* next = candidate->next;
    Block* merged = map_block(next, std::min(size - candidate->size, next->size));
    if (!merged) return nullptr;
    candidate = merged;
  }
  shard.pool(small).erase(FreeSet::s_iterator_to(*candidate));
  return candidate;
}

// The lowest unmapped range (with the free block just before it, if any)
// that offers `size` bytes of address space; a new segment when none does.
Block* CachingAllocator::Impl::find_expandable_block(Shard& shard, bool small, std::size_t size) {
  auto has_room = [size](const Block* b) {
    std::size_t bytes = 0;
    for (; bytes < size && allocatable(b); b = b->next) bytes += b->size;
    return bytes >= size;
  };
  for (Block& unmapped : shard.unmapped(small)) {
    Block* c = &unmapped;
    if (allocatable(c->prev)) c = c->prev;
    if (has_room(c)) return c;
  }
  auto segment = std::make_unique<ExpandableSegment>();
  segment->chunk = small ? kSmallBuffer : kLargeBuffer;
  // Address space for 1 1/8 of the device, so that pages unmapped early in the
  // segment can be mapped again at its end.
  const std::size_t total = device->memory_info().total;
  const std::size_t chunks = (total + total / 8 + segment->chunk - 1) / segment->chunk;
  segment->size = chunks * segment->chunk;
  segment->ptr = reinterpret_cast<std::uintptr_t>(device->reserve_address_range(segment->size));
  if (!segment->ptr) throw DeviceError("expandable segments: the device could not reserve an address range");
  Block* block = new_block(shard);
  block->ptr = segment->ptr;
  block->size = segment->size;
  block->shard = &shard;
  block->small = small;
  block->mapped = false;
  block->expandable = segment.get();
  shard.unmapped(small).insert(*block);
  owners.add(block->ptr, block->size, &shard, /*fill_now=*/false);  // map_block fills what it maps
  std::lock_guard lock(segments_mutex);
  segments[block->ptr] = block;
  expandable_segments.push_back(std::move(segment));
  return block;
}

// Backs the first `size` bytes (rounded up to whole chunks) of the unmapped
// block `to_map` with memory, merges it with free mapped neighbours and
// caches it. Returns the resulting free block, nullptr when out of memory.
Block* CachingAllocator::Impl::map_block(Block* to_map, std::size_t size) {
  ExpandableSegment& es = *to_map->expandable;
  const std::size_t begin = es.chunk_index(to_map->ptr);
  const std::size_t end = (to_map->ptr + size - es.ptr + es.chunk - 1) / es.chunk;
  const std::size_t mapped_size = (end - begin) * es.chunk;
  if (!device->map(reinterpret_cast<void*>(to_map->ptr), mapped_size, es.chunk)) return nullptr;
  // Granules once mapped keep naming this pool until the segment goes:
  // the whole range stays this pool's.
  owners.fill(to_map->ptr, mapped_size);
  Shard& shard = *to_map->shard;
  shard.unmapped(to_map->small).erase(UnmappedSet::s_iterator_to(*to_map));
  to_map->mapped = true;
  if (mapped_size < to_map->size) {
    Block* rest = new_block(shard);
    rest->ptr = to_map->ptr + mapped_size;
    rest->size = to_map->size - mapped_size;
    rest->shard = &shard;
    rest->small = to_map->small;
    rest->mapped = false;
    rest->expandable = to_map->expandable;
    rest->prev = to_map;
    rest->next = to_map->next;
    if (rest->next) rest->next->prev = rest;
    to_map->next = rest;
    to_map->size = mapped_size;
    shard.unmapped(rest->small).insert(*rest);
  }
  const std::uintptr_t mapped_at = to_map->ptr;
  Block* block = to_map;
  if (Block* merged = try_merge(block, block->prev)) block = merged;
  if (Block* merged = try_merge(block, block->next)) block = merged;
  cache(block);
  es.mapped += mapped_size;
  total_reserved.fetch_add(mapped_size, std::memory_order_relaxed);
  {
    PendingStats& pending = shard.unpublished;
    for (std::size_t t : {std::size_t{stat_all}, block->small ? std::size_t{stat_small_pool} : std::size_t{stat_large_pool}})
      pending.reserved_bytes[t].increase(static_cast<std::int64_t>(mapped_size));
    ++pending.num_device_alloc;
  }
  emit(shard, EventKind::segment_map, mapped_at, mapped_size, std::size_t{events::segment_flag_expandable} | (block->small ? 0u : std::size_t{events::segment_flag_large_pool}));
  return block;
}

// Unmaps the whole chunks inside the cached block `block`; the parts before
// and after stay mapped and cached.
void CachingAllocator::Impl::unmap_block(Block* block) {
  ExpandableSegment& es = *block->expandable;
  const std::size_t begin = (block->ptr - es.ptr + es.chunk - 1) / es.chunk;
  const std::size_t end = (block->ptr + block->size - es.ptr) / es.chunk;
  if (begin >= end) return;
  const std::uintptr_t unmapped_ptr = es.ptr + begin * es.chunk;
  const std::size_t unmapped_size = (end - begin) * es.chunk;
  Shard& shard = *block->shard;
  shard.pool(block->small).erase(FreeSet::s_iterator_to(*block));
  emit(shard, EventKind::segment_unmap, unmapped_ptr, unmapped_size, 0);
  device->unmap(reinterpret_cast<void*>(unmapped_ptr), unmapped_size, es.chunk);

  const std::size_t before = unmapped_ptr - block->ptr;
  const std::size_t after = block->size - before - unmapped_size;
  auto insert_after = [&](Block* at, std::uintptr_t ptr, std::size_t size) {
    Block* b = new_block(shard);
    b->ptr = ptr;
    b->size = size;
    b->shard = &shard;
    b->small = at->small;
    b->expandable = at->expandable;
    b->prev = at;
    b->next = at->next;
    if (b->next) b->next->prev = b;
    at->next = b;
    return b;
  };
  // `block` keeps the front piece, so a segment's first block never changes.
  Block* hole = block;
  if (before > 0) {
    block->size = before;
    cache(block);
    hole = insert_after(block, unmapped_ptr, unmapped_size);
  } else {
    block->size = unmapped_size;
  }
  if (after > 0) cache(insert_after(hole, unmapped_ptr + unmapped_size, after));
  hole->mapped = false;
  if (Block* merged = try_merge(hole, hole->prev)) hole = merged;
  if (Block* merged = try_merge(hole, hole->next)) hole = merged;
  shard.unmapped(hole->small).insert(*hole);

  es.mapped -= unmapped_size;
  total_reserved.fetch_sub(unmapped_size, std::memory_order_relaxed);
  PendingStats& pending = shard.unpublished;
  for (std::size_t t : {std::size_t{stat_all}, hole->small ? std::size_t{stat_small_pool} : std::size_t{stat_large_pool}})
    pending.reserved_bytes[t].decrease(static_cast<std::int64_t>(unmapped_size));
  ++pending.num_device_free;
}

// Gives back a segment that is one unmapped block again.
void CachingAllocator::Impl::release_expandable_segment(Block* block) {
  ExpandableSegment* es = block->expandable;
  block->shard->unmapped(block->small).erase(UnmappedSet::s_iterator_to(*block));
  owners.remove(es->ptr);  // before the device may give the range to another segment
  device->release_address_range(reinterpret_cast<void*>(es->ptr), es->size);
  {
    std::lock_guard lock(segments_mutex);
    segments.erase(es->ptr);
    auto it = std::find_if(expandable_segments.begin(), expandable_segments.end(),
                           [es](const auto& p) { return p.get() == es; });
    if (it != expandable_segments.end()) expandable_segments.erase(it);
  }
  recycle(block);
}

// empty_cache and the OOM path for expandable blocks: unmap every free whole
// chunk, and give back segments left with nothing mapped.
void CachingAllocator::Impl::release_expandable(std::vector<Block*>& blocks) {
  for (Block* block : blocks) {
    ExpandableSegment* es = block->expandable;
    unmap_block(block);  // may recycle `block` into a merged neighbour
    Block* head = nullptr;
    {
      std::lock_guard lock(segments_mutex);
      auto it = segments.find(es->ptr);
      if (it != segments.end()) head = it->second;
    }
    // A segment's first block never changes; unmapped and alone, it is the whole segment.
    if (head && !head->mapped && !head->next) release_expandable_segment(head);
  }
}

}  // namespace cachealloc
