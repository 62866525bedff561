// The cached path: a request served from a stream's own shard takes that
// shard's lock and no other (its live blocks are in the shard's own table; a
// free finds the shard through the lock-free segment index), and makes no
// device call and no heap allocation. Anything else goes to
// allocator_slow.cpp.
#include <algorithm>
#include <bit>
#include <cstdio>

#include "allocator_impl.hpp"

namespace cachealloc {

using events::EventKind;

namespace {

std::size_t roundup_power2_next_division(std::size_t size, std::size_t divisions) {
  if (std::has_single_bit(size)) return size;
  // Split [2^k, 2^(k+1)) into `divisions` equal steps and round up to the next step.
  const std::size_t power2_floor = std::bit_floor(size);
  const std::size_t step = power2_floor >> (std::bit_width(divisions) - 1);
  if (step == 0) return power2_floor << 1;
  const std::size_t floor = size & ~(step - 1);
  return floor == size ? size : floor + step;
}

}  // namespace

CachingAllocator::Impl::Impl(std::shared_ptr<Device> dev, AllocatorConfig cfg)
    : device(std::move(dev)),
      config(std::move(cfg)),
      roundup_configured(std::any_of(config.roundup_power2_divisions.begin(), config.roundup_power2_divisions.end(),
                                     [](std::size_t d) { return d > 1; })),
      generation(register_live(this)) {
  if (!device) {
    unregister_live();
    throw InvalidArgument("CachingAllocator: no device");
  }
  // PyTorch casts its size_t setting, so "no limit" reads -1 in memory_stats().
  stats.max_split_size = config.max_split_size == std::numeric_limits<std::size_t>::max()
                             ? -1
                             : static_cast<std::int64_t>(config.max_split_size);
}

CachingAllocator::Impl::~Impl() {
  unregister_live();  // no other thread folds a shard of this allocator from here on
  try {
    std::vector<std::unique_lock<detail::ShardMutex>> locks;
    lock_all(locks);
    synchronize_and_free_events();
    // Return every segment, live blocks included: the allocator owns them.
    std::lock_guard guard(segments_mutex);
    for (auto& [address, head] : segments) {
      if (ExpandableSegment* es = head->expandable) {
        // Unmap each maximal mapped run, then give back the address range.
        for (Block* b = head; b;) {
          if (!b->mapped) {
            b = b->next;
            continue;
          }
          const std::uintptr_t start = b->ptr;
          std::size_t length = 0;
          for (; b && b->mapped; b = b->next) length += b->size;
          device->unmap(reinterpret_cast<void*>(start), length, es->chunk);
        }
        device->release_address_range(reinterpret_cast<void*>(es->ptr), es->size);
        continue;
      }
      std::size_t size = 0;
      for (Block* b = head; b; b = b->next) size += b->size;
      device->release(reinterpret_cast<void*>(address), size);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cachealloc: while destroying the allocator: %s\n", e.what());
  }
  for (Shard* shard : shards) {
    for (DeviceEvent event : shard->spare_events) device->destroy_event(event);
    for (Block* b : shard->spare_blocks) delete b;
    shard->small_blocks.clear();
    shard->large_blocks.clear();
    shard->small_unmapped.clear();
    shard->large_unmapped.clear();
  }
  for (auto& [address, head] : segments) {
    for (Block* b = head; b;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
  }
  for (Shard* shard : shards) delete shard;
}

// Rule: sizes below 512 B round to 512; others to a multiple of 512, or with
// roundup_power2_divisions to the next of N equal steps between powers of two.
inline std::size_t CachingAllocator::Impl::round_size(std::size_t size) const noexcept {
  if (size < kMinBlockSize) return kMinBlockSize;
  if (roundup_configured) {
    const std::size_t divisions = roundup_divisions_for(config, size);
    if (divisions > 1 && size > kMinBlockSize * divisions) return roundup_power2_next_division(size, divisions);
  }
  return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

// Rule: <= 1 MiB -> 2 MiB segment; < 10 MiB -> 20 MiB; else round up to 2 MiB.
std::size_t CachingAllocator::Impl::allocation_size(std::size_t size) noexcept {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((size + kRoundLarge - 1) / kRoundLarge);
}

Shard& CachingAllocator::Impl::shard_for(Stream stream, PrivatePoolId pool) {
  const std::uint64_t key = stream.handle ^ (pool.first * 0x632be59bd9b4e019ull) ^ (pool.second * 0x85157af5ull);
  const std::size_t home = static_cast<std::size_t>((key * 0x9e3779b97f4a7c15ull) >> 54) % kShardSlots;
  for (std::size_t i = 0; i < kShardSlots; ++i) {
    Shard* shard = shard_table[(home + i) % kShardSlots].load(std::memory_order_acquire);
    if (!shard) break;
    if (shard->stream == stream && shard->private_pool == pool) return *shard;
  }
  std::lock_guard lock(registry_mutex);
  for (std::size_t i = 0; i < kShardSlots; ++i) {
    auto& slot = shard_table[(home + i) % kShardSlots];
    Shard* shard = slot.load(std::memory_order_acquire);
    if (shard && shard->stream == stream && shard->private_pool == pool) return *shard;
    if (!shard) {
      shard = new Shard(stream, pool);
      shard->origin = AllocatorEventOrigin{stream, &shard->event_order, &event_order_all};
      auto pos = std::lower_bound(shards.begin(), shards.end(), std::pair{stream, pool},
                                  [](const Shard* s, const std::pair<Stream, PrivatePoolId>& k) {
                                    return std::pair{s->stream, s->private_pool} < k;
                                  });
      shards.insert(pos, shard);
      slot.store(shard, std::memory_order_release);
      return *shard;
    }
  }
  throw InvalidArgument("allocate: more than " + std::to_string(kShardSlots) + " distinct streams and pools");
}

PrivatePoolId CachingAllocator::Impl::capture_pool(Stream stream) {
  std::lock_guard lock(captures_mutex);
  for (const auto& [pool, filter] : captures) {
    if (filter(stream)) return pool;
  }
  return PrivatePoolId{};
}

void* CachingAllocator::Impl::hand_out(Shard& shard, Block* block, std::size_t size, std::size_t requested,
                                       int split) {
  const bool already_split = block->is_split();
  const std::size_t type = block->small ? stat_small_pool : stat_large_pool;
  std::size_t split_rest = 0;  // the split's remainder, 0 for no split
  std::int64_t inactive_split_count = 0;
  std::int64_t inactive_split_bytes = 0;
  if (split < 0 ? should_split(*block, size) : (split > 0 && block->size > size)) {
    // The block keeps the front; a new block takes the remainder, so a
    // segment's first block object never changes.
    Block* rest = new_block(shard);
    rest->ptr = block->ptr + size;
    rest->size = block->size - size;
    rest->shard = &shard;
    rest->small = block->small;
    rest->expandable = block->expandable;
    rest->prev = block;
    rest->next = block->next;
    if (rest->next) rest->next->prev = rest;
    block->next = rest;
    block->size = size;
    cache(rest);
    split_rest = rest->size;
    if (block->expandable) {
      // Inactive split bytes exclude expandable segments, as in PyTorch:
      // their free pages can always be unmapped.
    } else if (already_split) {
      inactive_split_bytes = -static_cast<std::int64_t>(size);  // a free split block shrinks
    } else {
      inactive_split_count = 1;  // a whole segment becomes split
      inactive_split_bytes = static_cast<std::int64_t>(rest->size);
    }
  } else if (already_split && !block->expandable) {
    inactive_split_count = -1;  // a free split block becomes active
    inactive_split_bytes = -static_cast<std::int64_t>(block->size);
  }
  block->allocated = true;
  block->requested = requested;
  {
    PendingStats& pending = shard.unpublished;
    for (std::size_t t : {std::size_t{stat_all}, type}) {
      pending.inactive_split[t].change(inactive_split_count);
      pending.inactive_split_bytes[t].change(inactive_split_bytes);
      pending.allocation[t].increase(1);
      pending.allocated_bytes[t].increase(static_cast<std::int64_t>(block->size));
      pending.active[t].increase(1);
      pending.active_bytes[t].increase(static_cast<std::int64_t>(block->size));
      pending.requested_bytes[t].increase(static_cast<std::int64_t>(requested));
    }
    if (block->size >= config.max_split_size) pending.oversize_allocations.increase(1);
  }
  // Read under the shard lock: stop() clears it, then waits for every one.
  AllocatorObserver* const o = observer.load(std::memory_order_acquire);
  block->stack = o ? o->on_alloc(shard.origin, continues_call(split_rest ? EventKind::split : EventKind::alloc),
                                 block->ptr, block->size, requested, split_rest)
                   : 0;
  shard.live.insert(block->ptr, block);
  maybe_publish(shard);
  return reinterpret_cast<void*>(block->ptr);
}

void* CachingAllocator::Impl::allocate(std::size_t requested, Stream stream) {
  begin_call();
  if (requested == 0) throw InvalidArgument("allocate: a request of 0 bytes");
  if (requested > kMaxRequest)
    throw InvalidArgument("allocate: a request of " + std::to_string(requested) +
                          " bytes is larger than any device (a negative size cast to size_t?)");
  const std::size_t size = round_size(requested);
  const bool small = size <= kSmallSize;
  const bool capture = capturing();
  if (!capture && deferred_event_blocks.load(std::memory_order_acquire) != 0) {
    // The first request after every capture ended records the events the
    // frees during capture could not (PyTorch's process_events).
    std::vector<std::unique_lock<detail::ShardMutex>> locks;
    lock_all(locks);
    insert_deferred_events();
  }
  Shard* pool = nullptr;
  if (!capture && t_shard.allocator == generation && t_shard.stream == stream.handle) [[likely]] {
    pool = t_shard.shard;
  } else {
    pool = &shard_for(stream, capture ? capture_pool(stream) : PrivatePoolId{});
    if (!capture) t_shard = ThreadShard{generation, stream.handle, pool};
  }
  Shard& shard = *pool;
  if (!capture && shards_with_pending.load(std::memory_order_acquire) >
                      (shard.has_pending.load(std::memory_order_relaxed) ? 1u : 0u)) [[unlikely]]
    process_other_shards(shard);
  flush_deferred(shard);
  std::unique_lock lock(shard.mutex);
  begin_call();  // after the deferred path's locks: read the clock afresh under this one
  // No event is queried while a capture is under way (it would break it):
  // read again under the lock (begin_allocate_to_pool).
  if (!shard.pending.empty() && !capturing()) process_events(shard);
  if (Block* block = get_free_block(shard, small, size, /*count_for_gc=*/true))
    return hand_out(shard, block, size, requested);
  // Miss. Unless garbage collection must run first (it looks at every
  // stream), try a new segment under this stream's lock alone.
  bool device_tried = false;
  if (!gc_active()) {
    if (Block* block = reserve_segment(shard, small, size, /*is_retry=*/false))
      return hand_out(shard, block, size, requested);
    device_tried = true;
  }
  lock.unlock();
  return allocate_slow(shard, size, requested, device_tried);
}

FreeStatus CachingAllocator::Impl::deallocate(void* ptr) noexcept {
  begin_call();
  if (!ptr) return FreeStatus::null_pointer;
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  if (Shard* const owner = owners.find(address)) {
    Shard& shard = *owner;
    flush_deferred(shard);
    try {
      std::lock_guard lock(shard.mutex);
      if (Block* block = shard.live.take(address)) {
        block->allocated = false;
        if (!block->stream_uses.empty()) {
          emit(shard, EventKind::free_requested, block->ptr, block->size, block->requested);
          release_allocation_stats(*block);
          if (capturing()) {
            shard.deferred_events.push_back(block);
            deferred_event_blocks.fetch_add(1, std::memory_order_release);
          } else {
            insert_events(block);
          }
        } else {
          free_block(block, /*also_release_allocation=*/true, /*requested_too=*/true);
        }
        maybe_publish(shard);
        return FreeStatus::ok;
      }
    } catch (const std::exception& e) {
      // Only a failing device event call gets here. Keep the block out of
      // circulation rather than risk reuse while another stream may use it.
      std::fprintf(stderr, "cachealloc: free of %p: %s; the block is leaked\n", ptr, e.what());
      return FreeStatus::ok;
    }
  }
  // Not live in any pool (the shard lock is released: this takes them all).
  const bool twice = find_free_block_at(address) != nullptr;
  std::fprintf(stderr, "cachealloc: %s %p: %s\n", twice ? "double free of" : "free of unknown pointer", ptr,
               twice ? "the block is already free; ignored" : "not returned by this allocator; ignored");
  return twice ? FreeStatus::double_free : FreeStatus::unknown_pointer;
}

void CachingAllocator::Impl::record_stream(void* ptr, Stream stream) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  Shard* const shard = owners.find(address);
  std::unique_lock<detail::ShardMutex> lock;
  Block* block = nullptr;
  if (shard) {
    lock = std::unique_lock(shard->mutex);
    block = shard->live.find(address);
  }
  if (!block) throw InvalidArgument("record_stream: pointer was not returned by this allocator or is already freed");
  if (stream == shard->stream) return;  // the allocation stream needs no event
  for (Stream s : block->stream_uses)
    if (s == stream) return;
  block->stream_uses.push_back(stream);
}

// A block used on other streams waits for an event on each before reuse.
void CachingAllocator::Impl::insert_events(Block* block) {
  Shard& shard = *block->shard;
  std::vector<Stream> streams;
  streams.swap(block->stream_uses);
  struct NotePending {  // also when creating or recording an event throws
    Impl& impl;
    Shard& shard;
    ~NotePending() { impl.note_pending(shard); }
  } note{*this, shard};
  for (Stream stream : streams) {
    DeviceEvent event;
    if (shard.spare_events.empty()) {
      event = device->create_event();
    } else {
      event = shard.spare_events.back();
      shard.spare_events.pop_back();
    }
    device->record_event(event, stream);
    ++block->event_count;
    shard.pending[stream].push_back(PendingFree{event, block});
  }
}

void CachingAllocator::Impl::note_pending(Shard& shard) noexcept {
  const bool now = !shard.pending.empty();
  if (shard.has_pending.load(std::memory_order_relaxed) == now) return;
  shard.has_pending.store(now, std::memory_order_relaxed);
  if (now) shards_with_pending.fetch_add(1, std::memory_order_release);
  else shards_with_pending.fetch_sub(1, std::memory_order_release);
}

void CachingAllocator::Impl::process_other_shards(const Shard& own) {
  // The registry, then one shard lock at a time: lock_all's order.
  std::lock_guard registry(registry_mutex);
  for (Shard* other : shards) {
    if (other == &own || !other->has_pending.load(std::memory_order_relaxed)) continue;
    {
      // Most requests find the events still running: a look, no change.
      std::lock_guard look(other->mutex);
      if (capturing()) return;  // begun since the request read it: no query (begin_allocate_to_pool)
      if (!events_ready(*other)) continue;
    }
    // This thread's changes fold in the order it made them (flush_deferred):
    // those it left in another shard first, these before its request's.
    flush_deferred(*other);
    std::lock_guard lock(other->mutex);
    if (capturing()) return;
    if (other->pending.empty()) continue;
    begin_call();  // its free_completed and merges are their own call's events
    process_events(*other);
    maybe_publish(*other);
  }
}

void CachingAllocator::Impl::insert_deferred_events() {
  for (Shard* shard : shards) {
    for (Block* block : shard->deferred_events) insert_events(block);
    deferred_event_blocks.fetch_sub(shard->deferred_events.size(), std::memory_order_release);
    shard->deferred_events.clear();
  }
}

bool CachingAllocator::Impl::events_ready(Shard& shard) {
  for (auto& [stream, queue] : shard.pending)
    if (!queue.empty() && device->query_event(queue.front().event)) return true;
  return false;
}

// Completes deferred frees whose events have fired. Per stream, oldest
// first, stopping at the first event not yet complete.
void CachingAllocator::Impl::process_events(Shard& shard) {
  for (auto it = shard.pending.begin(); it != shard.pending.end();) {
    auto& queue = it->second;
    while (!queue.empty()) {
      PendingFree& front = queue.front();
      if (!device->query_event(front.event)) break;
      shard.spare_events.push_back(front.event);
      Block* block = front.block;
      queue.pop_front();
      if (--block->event_count == 0) free_block(block, false);
    }
    it = queue.empty() ? shard.pending.erase(it) : std::next(it);
  }
  note_pending(shard);
}

// The allocation part of a free: allocated drops at once, even when the
// block waits for stream events before it is reusable.
void CachingAllocator::Impl::release_allocation_stats(const Block& block) {
  const std::size_t type = block.small ? stat_small_pool : stat_large_pool;
  PendingStats& pending = block.shard->unpublished;
  for (std::size_t t : {std::size_t{stat_all}, type}) {
    pending.allocation[t].decrease(1);
    pending.allocated_bytes[t].decrease(static_cast<std::int64_t>(block.size));
  }
  if (block.size >= config.max_split_size) pending.oversize_allocations.decrease(1);
}

void CachingAllocator::Impl::free_block(Block* block, bool also_release_allocation, bool requested_too) {
  const std::uintptr_t original_ptr = block->ptr;
  const std::size_t original_size = block->size;
  const std::size_t requested = block->requested;
  Shard& shard = *block->shard;
  std::size_t below = 0, above = 0;  // bytes merged in from each side, 0 for none
  std::int64_t split_count_change = 0;
  std::int64_t split_bytes_change = 0;
  for (int side = 0; side < 2; ++side) {
    Block* neighbour = side == 0 ? block->prev : block->next;
    const std::size_t absorbed = neighbour ? neighbour->size : 0;
    if (Block* merged = try_merge(block, neighbour)) {
      block = merged;
      --split_count_change;
      split_bytes_change -= static_cast<std::int64_t>(absorbed);
      (side == 0 ? below : above) = absorbed;
    }
  }
  // Read under the shard lock: stop() clears it, then waits for every one.
  if (AllocatorObserver* const o = observer.load(std::memory_order_acquire)) {
    // The merges' blocks from the sizes alone (blocks of a segment are
    // contiguous; the lower one survives a merge, at its address): reading
    // them back from the block just after try_merge stored its size would
    // wait for that store to retire (a failed store forwarding).
    AllocatorMerge merges[2];
    std::uint32_t merge_count = 0;
    std::uintptr_t merged_ptr = original_ptr;
    std::size_t merged_size = original_size;
    if (below != 0) {
      merged_ptr -= below;
      merged_size += below;
      merges[merge_count++] = AllocatorMerge{merged_ptr, merged_size, below};
    }
    if (above != 0) {
      merged_size += above;
      merges[merge_count++] = AllocatorMerge{merged_ptr, merged_size, above};
    }
    o->on_free(shard.origin, continues_call(requested_too ? EventKind::free_requested : EventKind::free_completed),
               requested_too, original_ptr, original_size, requested, merges, merge_count);
  }
  block->requested = 0;
  block->stack = 0;
  cache(block);
  if (block->is_split()) {
    ++split_count_change;
    split_bytes_change += static_cast<std::int64_t>(block->size);
  }
  if (block->expandable) split_count_change = split_bytes_change = 0;  // see hand_out
  const std::size_t type = block->small ? stat_small_pool : stat_large_pool;
  PendingStats& pending = shard.unpublished;
  if (also_release_allocation && original_size >= config.max_split_size) pending.oversize_allocations.decrease(1);
  for (std::size_t t : {std::size_t{stat_all}, type}) {
    if (also_release_allocation) {
      pending.allocation[t].decrease(1);
      pending.allocated_bytes[t].decrease(static_cast<std::int64_t>(original_size));
    }
    pending.inactive_split[t].change(split_count_change);
    pending.inactive_split_bytes[t].change(split_bytes_change);
    pending.active[t].decrease(1);
    pending.active_bytes[t].decrease(static_cast<std::int64_t>(original_size));
    pending.requested_bytes[t].decrease(static_cast<std::int64_t>(requested));
  }
}

namespace {

// Live allocators by generation, so that a thread whose pending pool is in
// another allocator can fold it there (or learn that allocator is gone).
// Lock order: g_live_mutex, then that allocator's shard lock.
std::mutex g_live_mutex;
std::vector<std::pair<std::uint64_t, CachingAllocator::Impl*>> g_live;
std::atomic<std::uint64_t> g_next_generation{1};

}  // namespace

std::uint64_t CachingAllocator::Impl::register_live(Impl* impl) {
  const std::uint64_t generation = g_next_generation.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(g_live_mutex);
  g_live.emplace_back(generation, impl);
  return generation;
}

void CachingAllocator::Impl::unregister_live() noexcept {
  std::lock_guard lock(g_live_mutex);
  std::erase_if(g_live, [&](const auto& entry) { return entry.first == generation; });
}

void CachingAllocator::Impl::publish(Shard& shard) noexcept {
  std::lock_guard lock(stats_lock);
  shard.unpublished.fold_into(stats);
}

inline void CachingAllocator::Impl::maybe_publish(Shard& shard) noexcept {
  t_pending = ThreadPending{generation, &shard};
  PendingStats& pending = shard.unpublished;
  if (++pending.operations < kPublishBatch) [[likely]]
    return;
  if (pending.operations < kPublishBatchLimit) {
    if (!stats_lock.try_lock()) return;  // another thread folds: next time
  } else {
    stats_lock.lock();
  }
  pending.fold_into(stats);
  stats_lock.unlock();
}

void CachingAllocator::Impl::flush_deferred_slow() noexcept {
  const ThreadPending waiting = t_pending;
  t_pending = ThreadPending{};
  if (waiting.allocator == generation) {
    std::lock_guard lock(waiting.shard->mutex);
    publish(*waiting.shard);
    return;
  }
  // The thread moved here from another allocator (a second device, say).
  std::lock_guard registry(g_live_mutex);
  for (auto& [other_generation, other] : g_live) {
    if (other_generation != waiting.allocator) continue;
    std::lock_guard lock(waiting.shard->mutex);
    other->publish(*waiting.shard);
    return;
  }
}

void CachingAllocator::Impl::publish_all_locked() noexcept {
  {
    std::lock_guard lock(stats_lock);
    for (Shard* shard : shards) shard->unpublished.fold_into(stats);
  }
}

void CachingAllocator::Impl::publish_all() {
  if (t_holds_all_locks) {
    publish_all_locked();
    return;
  }
  std::lock_guard registry(registry_mutex);
  for (Shard* shard : shards) {
    std::lock_guard pool(shard->mutex);
    publish(*shard);
  }
}

MemoryStats CachingAllocator::Impl::read_stats() const {
  const_cast<Impl*>(this)->publish_all();
  std::lock_guard lock(stats_lock);
  return stats;
}

// ---------------------------------------------------------------------------
// Public face.

CachingAllocator::CachingAllocator(std::shared_ptr<Device> device, AllocatorConfig config)
    : impl_(std::make_unique<Impl>(std::move(device), std::move(config))) {}
CachingAllocator::~CachingAllocator() = default;

void* CachingAllocator::allocate(std::size_t bytes, Stream stream) { return impl_->allocate(bytes, stream); }
FreeStatus CachingAllocator::deallocate(void* ptr) noexcept { return impl_->deallocate(ptr); }
void CachingAllocator::record_stream(void* ptr, Stream stream) { impl_->record_stream(ptr, stream); }

std::size_t CachingAllocator::memory_allocated() const {
  return static_cast<std::size_t>(impl_->read_stats().allocated_bytes[stat_all].current);
}
std::size_t CachingAllocator::memory_reserved() const {
  return static_cast<std::size_t>(impl_->read_stats().reserved_bytes[stat_all].current);
}
std::size_t CachingAllocator::max_memory_allocated() const {
  return static_cast<std::size_t>(impl_->read_stats().allocated_bytes[stat_all].peak);
}
std::size_t CachingAllocator::max_memory_reserved() const {
  return static_cast<std::size_t>(impl_->read_stats().reserved_bytes[stat_all].peak);
}
MemoryStats CachingAllocator::stats() const { return impl_->read_stats(); }
void CachingAllocator::reset_peak_stats() {
  impl_->publish_all();
  std::lock_guard lock(impl_->stats_lock);
  auto& s = impl_->stats;
  for (StatArray* array : {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
                           &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes})
    for (Stat& stat : *array) stat.reset_peak();
  s.oversize_allocations.reset_peak();
  s.oversize_segments.reset_peak();
}
void CachingAllocator::reset_accumulated_stats() {
  impl_->publish_all();
  std::lock_guard lock(impl_->stats_lock);
  auto& s = impl_->stats;
  for (StatArray* array : {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
                           &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes})
    for (Stat& stat : *array) stat.reset_accumulated();
  s.oversize_allocations.reset_accumulated();
  s.oversize_segments.reset_accumulated();
  s.num_alloc_retries = s.num_ooms = s.num_sync_all_streams = s.num_device_alloc = s.num_device_free = 0;
}
void CachingAllocator::set_observer(AllocatorObserver* observer) noexcept {
  impl_->observer.store(observer, std::memory_order_release);
}
const AllocatorConfig& CachingAllocator::config() const noexcept { return impl_->config; }
Device& CachingAllocator::device() noexcept { return *impl_->device; }
std::size_t CachingAllocator::memory_cap() const noexcept {
  return impl_->fraction_set_.load() ? impl_->allowed_memory_maximum.load() : 0;
}

}  // namespace cachealloc
