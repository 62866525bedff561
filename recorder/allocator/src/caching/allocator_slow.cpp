// The slow path: new segments, the out-of-memory sequence, garbage
// collection, empty_cache and layouts. Everything that looks at more than one
// stream's shard runs here with every shard locked, so it sees one consistent
// state, exactly as PyTorch's single allocator lock does.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "allocator_impl.hpp"

namespace cachealloc {

using events::EventKind;

std::vector<Shard*> CachingAllocator::Impl::lock_all(std::vector<std::unique_lock<detail::ShardMutex>>& locks) {
  locks.emplace_back(registry_mutex);
  locks.reserve(shards.size() + 1);
  for (Shard* shard : shards) locks.emplace_back(shard->mutex);  // ascending (stream, pool) order
  begin_call();  // the next event reads the clock under these locks
  // What every shard holds unpublished folds before the caller's changes,
  // which may touch several shards (empty_cache, a retry's releases): folded
  // after them, a rise still pending in one shard would land on totals
  // another shard's later release had already lowered, and lose its peak.
  publish_all_locked();
  return shards;
}

// Reserves a new segment of `alloc_size` bytes (cudaMalloc), charging the
// memory-fraction cap first. Returns nullptr when the cap or the device says no.
Block* CachingAllocator::Impl::reserve_segment(Shard& shard, bool small, std::size_t size, bool is_retry) {
  if (is_retry) ++shard.unpublished.num_alloc_retries;
  const std::size_t alloc_size = allocation_size(size);
  const bool capped = fraction_set_.load(std::memory_order_relaxed);
  const std::size_t cap = allowed_memory_maximum.load(std::memory_order_relaxed);
  std::size_t reserved = total_reserved.load(std::memory_order_relaxed);
  // Private pools use no expandable segments (PyTorch: its checkpointing of
  // private pools does not support them).
  if (config.expandable_segments && shard.private_pool.is_default()) {
    // PyTorch checks the cap against the plain segment size even here.
    if (capped && reserved + alloc_size > cap) return nullptr;
    return allocate_expandable(shard, small, size);
  }
  do {
    if (capped && reserved + alloc_size > cap) return nullptr;
  } while (!total_reserved.compare_exchange_weak(reserved, reserved + alloc_size, std::memory_order_relaxed));
  void* ptr = nullptr;
  try {
    ptr = device->reserve(alloc_size);
  } catch (...) {
    total_reserved.fetch_sub(alloc_size, std::memory_order_relaxed);
    throw;
  }
  if (!ptr) {
    total_reserved.fetch_sub(alloc_size, std::memory_order_relaxed);
    return nullptr;
  }
  Block* block = new_block(shard);
  block->ptr = reinterpret_cast<std::uintptr_t>(ptr);
  block->size = alloc_size;
  block->shard = &shard;
  block->small = small;
  {
    std::lock_guard lock(segments_mutex);
    segments[block->ptr] = block;
  }
  owners.add(block->ptr, alloc_size, &shard);
  {
    PendingStats& pending = shard.unpublished;
    for (std::size_t t : {std::size_t{stat_all}, small ? std::size_t{stat_small_pool} : std::size_t{stat_large_pool}}) {
      pending.segment[t].increase(1);
      pending.reserved_bytes[t].increase(static_cast<std::int64_t>(alloc_size));
    }
    if (alloc_size >= config.max_split_size) pending.oversize_segments.increase(1);
    ++pending.num_device_alloc;
  }
  block->segment_stack = emit(shard, EventKind::segment_alloc, block->ptr, alloc_size,
                              small ? std::size_t{0} : std::size_t{events::segment_flag_large_pool});
  return block;
}

// PyTorch's order once the pool has no fitting block: garbage collection
// (when a cap and a threshold are set), a new segment, then release cached
// oversize blocks of this stream and retry, then release every unsplit cached
// segment of every stream and retry once more (counted in num_alloc_retries).
void* CachingAllocator::Impl::allocate_slow(Shard& shard, std::size_t size, std::size_t requested,
                                            bool device_tried) {
  std::vector<std::unique_lock<detail::ShardMutex>> locks;
  lock_all(locks);
  const bool small = size <= kSmallSize;
  if (!capturing() && !shard.pending.empty()) process_events(shard);
  // Another thread may have freed a fitting block while we held no lock;
  // this second look is not a new request, so it does not age blocks.
  Block* block = get_free_block(shard, small, size, /*count_for_gc=*/false);
  if (!block) {
    if (gc_active()) garbage_collect();
    if (!device_tried) block = reserve_segment(shard, small, size, false);
    if (!block && release_available_cached_blocks(shard, small, size))
      block = reserve_segment(shard, small, size, false);
    if (!block) {
      release_cached_blocks();
      block = reserve_segment(shard, small, size, /*is_retry=*/true);
    }
  }
  if (!block) throw_out_of_memory(shard.stream, requested);
  void* ptr = hand_out(shard, block, size, requested);
  publish_all_locked();  // garbage collection and releases touched other pools
  return ptr;
}

// Rule (garbage_collection_threshold): once reserved exceeds threshold x cap,
// release unsplit cached large blocks at least as old as the average age,
// pass after pass, until enough is reclaimed or nothing more can go.
// Age = get_free_block calls on the pool since the block was cached.
void CachingAllocator::Impl::garbage_collect() {
  const auto threshold = static_cast<std::size_t>(config.garbage_collection_threshold *
                                                  static_cast<double>(allowed_memory_maximum.load()));
  const std::size_t reserved = total_reserved.load();
  if (reserved <= threshold) return;
  const std::size_t target = reserved - threshold;
  const std::size_t now = free_block_calls[0].load();
  auto age = [now](const Block& b) { return now - b.gc_count_base; };

  // Only the default pool's blocks are collected, as in PyTorch.
  std::size_t total_age = 0;
  std::size_t freeable = 0;
  for (Shard* s : shards)
    if (s->private_pool.is_default())
    for (const Block& b : s->large_blocks)
      if (!b.is_split()) {
        total_age += age(b);
        ++freeable;
      }
  if (freeable == 0) return;

  std::size_t reclaimed = 0;
  bool freed_one = true;
  while (reclaimed < target && freed_one && freeable > 0) {
    const double age_threshold = static_cast<double>(total_age) / static_cast<double>(freeable);
    freed_one = false;
    for (Shard* s : shards) {
      if (!s->private_pool.is_default()) continue;
      for (auto it = s->large_blocks.begin(); it != s->large_blocks.end();) {
        Block& b = *it++;
        if (b.is_split() || b.expandable || static_cast<double>(age(b)) < age_threshold) continue;
        freed_one = true;
        reclaimed += b.size;
        total_age -= age(b);
        --freeable;
        release_block(&b);
      }
    }
  }
}

// Rule: with max_split_size set, release one cached oversize block of this
// stream big enough for the request, or else the largest ones until their
// total covers it.
bool CachingAllocator::Impl::release_available_cached_blocks(Shard& shard, bool small, std::size_t size) {
  const std::size_t max_split = config.max_split_size;
  if (max_split == std::numeric_limits<std::size_t>::max()) return false;
  FreeSet& pool = shard.pool(small);
  const std::size_t key = std::max(size, max_split);
  auto it = pool.lower_bound(key, SizeKey{});
  if (it != pool.end() && !it->expandable) {
    release_block(&*it);
    return true;
  }
  if (it == pool.begin()) return false;
  std::size_t released = 0;
  --it;
  while (released < key && it->size >= max_split) {
    auto current = it;
    const bool first = current == pool.begin();
    if (!first) --it;
    if (!current->expandable) {
      released += current->size;
      release_block(&*current);
    }
    if (first) break;
  }
  return released >= key;
}

void CachingAllocator::Impl::synchronize_and_free_events(std::optional<PrivatePoolId> only) {
  {
    std::lock_guard lock(stats_lock);
    ++stats.num_sync_all_streams;
  }
  for (Shard* shard : shards) {
    if (only && shard->private_pool != *only) continue;
    for (auto& [stream, queue] : shard->pending) {
      for (PendingFree& pending : queue) {
        device->synchronize_event(pending.event);
        shard->spare_events.push_back(pending.event);
        if (--pending.block->event_count == 0) free_block(pending.block, false);
      }
    }
    shard->pending.clear();
    note_pending(*shard);
  }
}

std::size_t CachingAllocator::Impl::release_unsplit(FreeSet& set) {
  std::size_t released = 0;
  std::vector<Block*> expandable;
  for (auto it = set.begin(); it != set.end();) {
    Block& b = *it++;
    if (b.expandable) {
      expandable.push_back(&b);  // unmapping changes the set: after the walk
    } else if (!b.is_split()) {
      released += b.size;
      release_block(&b);
    }
  }
  release_expandable(expandable);
  return released;
}

// Rule (empty_cache and the last OOM step): wait for outstanding events, then
// release every cached block that is a whole segment, large pools first; for
// expandable segments, unmap every free whole chunk.
// Private pools: only those no longer used (use count 0), and only for the
// default id or their own; a pool left with no segment is forgotten.
void CachingAllocator::Impl::release_cached_blocks(PrivatePoolId which) {
  // As PyTorch: while a graph is being captured the default pool keeps its
  // cached blocks (its frees may still be pending on the capture).
  if (which.is_default() && !capturing()) {
    synchronize_and_free_events();
    for (Shard* s : shards)
      if (s->private_pool.is_default()) release_unsplit(s->large_blocks);
    for (Shard* s : shards)
      if (s->private_pool.is_default()) release_unsplit(s->small_blocks);
  }
  for (auto it = private_pools.begin(); it != private_pools.end();) {
    const PrivatePoolId pool = it->first;
    if (it->second > 0 || (!which.is_default() && pool != which)) {
      ++it;
      continue;
    }
    // Emptying one pool first settles that pool's pending frees (and counts
    // a sync, as PyTorch's memory_stats() does); a capture cannot sync.
    if (!which.is_default() && !capturing()) synchronize_and_free_events(pool);
    for (Shard* s : shards)
      if (s->private_pool == pool) release_unsplit(s->small_blocks);
    for (Shard* s : shards)
      if (s->private_pool == pool) release_unsplit(s->large_blocks);
    bool holds_segments = false;
    {
      std::lock_guard lock(segments_mutex);
      for (const auto& [address, head] : segments) {
        if (head->shard->private_pool == pool) {
          holds_segments = true;
          break;
        }
      }
    }
    it = holds_segments ? std::next(it) : private_pools.erase(it);
  }
}

// Returns a cached whole-segment block to the device.
void CachingAllocator::Impl::release_block(Block* block) {
  Shard& shard = *block->shard;
  shard.pool(block->small).erase(FreeSet::s_iterator_to(*block));
  const std::uintptr_t ptr = block->ptr;
  const std::size_t size = block->size;
  emit(shard, EventKind::segment_release, ptr, size, 0);
  owners.remove(ptr);  // before the device may give the address to another segment
  device->release(reinterpret_cast<void*>(ptr), size);
  total_reserved.fetch_sub(size, std::memory_order_relaxed);
  {
    std::lock_guard lock(segments_mutex);
    segments.erase(ptr);
  }
  {
    PendingStats& pending = shard.unpublished;
    for (std::size_t t : {std::size_t{stat_all}, block->small ? std::size_t{stat_small_pool} : std::size_t{stat_large_pool}}) {
      pending.segment[t].decrease(1);
      pending.reserved_bytes[t].decrease(static_cast<std::int64_t>(size));
    }
    if (size >= config.max_split_size) pending.oversize_segments.decrease(1);
    ++pending.num_device_free;
  }
  recycle(block);
}

void CachingAllocator::Impl::throw_out_of_memory(Stream stream, std::size_t requested) {
  MemoryInfo info;
  try {
    info = device->memory_info();
  } catch (const std::exception&) {
  }
  const std::size_t cap = fraction_set_.load() ? allowed_memory_maximum.load() : 0;
  MemoryStats now;
  publish_all_locked();  // every shard lock is held here
  {
    std::lock_guard lock(stats_lock);
    ++stats.num_ooms;
    now = stats;
  }
  emit_global(EventKind::oom, stream, info.free, requested, cap);
  const auto allocated = static_cast<std::size_t>(now.allocated_bytes[stat_all].current);
  const auto reserved = static_cast<std::size_t>(now.reserved_bytes[stat_all].current);
  std::ostringstream message;
  message << "out of memory: tried to allocate " << format_bytes(requested) << " (" << requested << " bytes) on "
          << device->backend() << " device " << device->index() << " (" << device->name() << ", "
          << format_bytes(info.total) << " total, " << format_bytes(info.free) << " free); allocated "
          << format_bytes(allocated) << ", reserved " << format_bytes(reserved) << " ("
          << format_bytes(reserved - allocated) << " reserved but unallocated)";
  if (cap) message << ", cap " << format_bytes(cap) << " by memory fraction";
  if (reserved > allocated && (reserved - allocated) * 5 > reserved && reserved - allocated >= requested) {
    message << "; reserved-but-unallocated memory is large: it is split into pieces too small for this request, "
               "try CACHEALLOC_CONF=max_split_size_mb:"
            << std::max<std::size_t>(21, requested >> 21) << " to limit fragmentation";
  } else if (cap && reserved + requested > cap) {
    message << "; the memory fraction cap is the limit: raise it with set_memory_fraction";
  }
  throw OutOfMemoryError(message.str(), requested, allocated, reserved, info.free, cap);
}

// A free (not live) block starting at `address`, for telling a double free
// from a foreign pointer. Error path only.
// Every shard lock is held for the whole look-up: with only segments_mutex,
// another thread's empty_cache could release and recycle the segment between
// finding its head block and walking it.
Block* CachingAllocator::Impl::find_free_block_at(std::uintptr_t address) {
  try {
    std::vector<std::unique_lock<detail::ShardMutex>> locks;
    lock_all(locks);
    std::lock_guard lock(segments_mutex);
    auto it = segments.upper_bound(address);
    if (it == segments.begin()) return nullptr;
    for (Block* b = std::prev(it)->second; b; b = b->next)
      if (b->ptr == address) return b->allocated ? nullptr : b;
  } catch (...) {
  }
  return nullptr;
}

// ---------------------------------------------------------------------------
// Public face of the slow path.

void CachingAllocator::empty_cache() {
  Impl::begin_call();
  std::vector<std::unique_lock<detail::ShardMutex>> locks;
  impl_->lock_all(locks);
  const std::size_t before = impl_->total_reserved.load();
  impl_->release_cached_blocks();
  impl_->publish_all_locked();
  impl_->emit_global(EventKind::empty_cache, Stream{}, 0, before - impl_->total_reserved.load(), 0);
}

void CachingAllocator::empty_cache(PrivatePoolId pool) {
  if (pool.is_default()) {
    empty_cache();
    return;
  }
  Impl::begin_call();
  std::vector<std::unique_lock<detail::ShardMutex>> locks;
  impl_->lock_all(locks);
  const std::size_t before = impl_->total_reserved.load();
  impl_->release_cached_blocks(pool);
  impl_->publish_all_locked();
  if (before != impl_->total_reserved.load())
    impl_->emit_global(EventKind::empty_cache, Stream{}, 0, before - impl_->total_reserved.load(), 0);
}

void CachingAllocator::create_or_incref_pool(PrivatePoolId pool) {
  if (pool.is_default()) throw InvalidArgument("create_or_incref_pool: {0, 0} is the default pool");
  std::lock_guard lock(impl_->registry_mutex);
  auto [it, created] = impl_->private_pools.try_emplace(pool, 1);
  if (!created) {
    if (it->second <= 0)
      throw InvalidArgument("create_or_incref_pool: pool (" + std::to_string(pool.first) + ", " +
                            std::to_string(pool.second) + ") is no longer in use and cannot be reused");
    ++it->second;
  }
}

void CachingAllocator::begin_allocate_to_pool(PrivatePoolId pool, StreamFilter filter) {
  if (!filter) throw InvalidArgument("begin_allocate_to_pool: no stream filter");
  create_or_incref_pool(pool);
  {
    std::lock_guard lock(impl_->captures_mutex);
    for (const auto& [underway, f] : impl_->captures) {
      if (underway == pool) {
        throw InvalidArgument("begin_allocate_to_pool: already allocating to pool (" + std::to_string(pool.first) +
                              ", " + std::to_string(pool.second) + ")");
      }
    }
    impl_->captures.emplace_back(pool, std::move(filter));
    impl_->captures_underway.store(static_cast<int>(impl_->captures.size()), std::memory_order_release);
  }
  // A request that read before this that no capture was under way may be
  // about to query events, which would break the capture the caller begins
  // next. Every query reads captures_underway again under its shard's lock;
  // taking each lock once here waits for those already inside, so that from
  // the return on none is made (PyTorch: one lock over malloc and this call).
  std::vector<std::unique_lock<detail::ShardMutex>> locks;
  impl_->lock_all(locks);
}

void CachingAllocator::end_allocate_to_pool(PrivatePoolId pool) {
  std::lock_guard lock(impl_->captures_mutex);
  for (auto it = impl_->captures.begin(); it != impl_->captures.end(); ++it) {
    if (it->first == pool) {
      impl_->captures.erase(it);
      impl_->captures_underway.store(static_cast<int>(impl_->captures.size()), std::memory_order_release);
      return;
    }
  }
  throw InvalidArgument("end_allocate_to_pool: not allocating to pool (" + std::to_string(pool.first) + ", " +
                        std::to_string(pool.second) + ")");
}

void CachingAllocator::release_pool(PrivatePoolId pool) {
  std::lock_guard lock(impl_->registry_mutex);
  auto it = impl_->private_pools.find(pool);
  if (it == impl_->private_pools.end() || it->second <= 0)
    throw InvalidArgument("release_pool: no pool (" + std::to_string(pool.first) + ", " +
                          std::to_string(pool.second) + ") in use");
  --it->second;
}

int CachingAllocator::pool_use_count(PrivatePoolId pool) const {
  std::lock_guard lock(impl_->registry_mutex);
  auto it = impl_->private_pools.find(pool);
  return it == impl_->private_pools.end() ? 0 : it->second;
}

PoolCheckpoint CachingAllocator::checkpoint_pool(PrivatePoolId pool) {
  std::vector<std::unique_lock<detail::ShardMutex>> locks;
  impl_->lock_all(locks);
  auto it = impl_->private_pools.find(pool);
  if (it == impl_->private_pools.end() || it->second <= 0)
    throw InvalidArgument("checkpoint_pool: no pool (" + std::to_string(pool.first) + ", " +
                          std::to_string(pool.second) + ") in use");
  if (!impl_->capturing()) impl_->insert_deferred_events();
  PoolCheckpoint checkpoint;
  checkpoint.pool = pool;
  std::lock_guard guard(impl_->segments_mutex);
  for (const auto& [address, head] : impl_->segments) {
    if (head->shard->private_pool != pool) continue;
    PoolCheckpoint::SegmentState segment;
    for (const Block* b = head; b; b = b->next) segment.blocks.push_back({b->ptr, b->size, b->allocated});
    checkpoint.segments.push_back(std::move(segment));
  }
  return checkpoint;
}

PoolRestore CachingAllocator::restore_pool(const PoolCheckpoint& checkpoint) {
  Impl::begin_call();
  Impl& impl = *impl_;
  std::vector<std::unique_lock<detail::ShardMutex>> locks;
  impl.lock_all(locks);
  const PrivatePoolId pool = checkpoint.pool;
  auto fail = [&](const std::string& why) {
    throw InvalidArgument("restore_pool: pool (" + std::to_string(pool.first) + ", " + std::to_string(pool.second) +
                          "): " + why);
  };
  auto known = impl.private_pools.find(pool);
  if (known == impl.private_pools.end() || known->second <= 0) fail("no such pool in use");
  // A free under the locks we hold (deallocate() would take them again).
  auto free_live = [&](std::uintptr_t address) {
    Shard* const owner = impl.owners.find(address);
    Block* block = owner ? owner->live.take(address) : nullptr;
    if (!block) fail("block " + std::to_string(address) + " is not allocated");
    Shard& shard = *block->shard;
    block->allocated = false;
    impl.emit(shard, EventKind::free_requested, block->ptr, block->size, block->requested);
    if (!block->stream_uses.empty()) {
      impl.release_allocation_stats(*block);
      impl.insert_events(block);
    } else {
      impl.free_block(block, /*also_release_allocation=*/true);
    }
  };
  PoolRestore result;
  // 1. Free every block allocated in the pool now.
  std::vector<std::uintptr_t> allocated_now;
  {
    std::lock_guard guard(impl.segments_mutex);
    for (const auto& [address, head] : impl.segments) {
      if (head->shard->private_pool != pool) continue;
      for (const Block* b = head; b; b = b->next) {
        if (b->allocated) {
          if (b->event_count > 0) fail("a block still waits for stream events");
          allocated_now.push_back(b->ptr);
        }
      }
    }
  }
  for (const std::uintptr_t address : allocated_now) {
    free_live(address);
    result.freed.push_back(reinterpret_cast<void*>(address));
  }
  // 2. Every segment is now one free block; carve each checkpointed one
  // into its blocks, all allocated, then free those that were free.
  for (const PoolCheckpoint::SegmentState& segment : checkpoint.segments) {
    if (segment.blocks.empty()) continue;
    Block* head = nullptr;
    {
      std::lock_guard guard(impl.segments_mutex);
      auto it = impl.segments.find(segment.blocks.front().ptr);
      if (it != impl.segments.end() && it->second->shard->private_pool == pool) head = it->second;
    }
    if (!head) fail("segment " + std::to_string(segment.blocks.front().ptr) + " is gone");
    Block* current = head;
    for (std::size_t i = 0; i < segment.blocks.size(); ++i) {
      const PoolCheckpoint::BlockState& state = segment.blocks[i];
      if (!current || current->allocated || current->pending() || current->ptr != state.ptr || current->size < state.size)
        fail("segment " + std::to_string(segment.blocks.front().ptr) + " does not match the checkpoint");
      current->shard->pool(current->small).erase(FreeSet::s_iterator_to(*current));
      impl.hand_out(*current->shard, current, state.size, state.size, /*split=*/1);
      current = current->next;
      if ((current != nullptr) != (i + 1 < segment.blocks.size()))
        fail("segment " + std::to_string(segment.blocks.front().ptr) + " does not match the checkpoint");
    }
    for (const PoolCheckpoint::BlockState& state : segment.blocks) {
      if (state.allocated) {
        result.allocated.push_back(reinterpret_cast<void*>(state.ptr));
      } else {
        free_live(state.ptr);
      }
    }
  }
  impl.publish_all_locked();
  return result;
}

std::map<std::uintptr_t, PrivatePoolId> CachingAllocator::private_segments() const {
  std::vector<std::unique_lock<detail::ShardMutex>> locks;
  impl_->lock_all(locks);
  std::map<std::uintptr_t, PrivatePoolId> out;
  std::lock_guard guard(impl_->segments_mutex);
  for (const auto& [address, head] : impl_->segments) {
    if (head->shard->private_pool.is_default()) continue;
    // Expandable runs are never private, so the head's address names the segment.
    out.emplace(address, head->shard->private_pool);
  }
  return out;
}

void CachingAllocator::set_memory_fraction(double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0))
    throw InvalidArgument("set_memory_fraction: " + std::to_string(fraction) + " is not within [0, 1]");
  const MemoryInfo info = impl_->device->memory_info();
  std::lock_guard lock(impl_->registry_mutex);
  impl_->device_total = info.total;
  impl_->allowed_memory_maximum.store(static_cast<std::size_t>(fraction * static_cast<double>(info.total)));
  impl_->fraction_set_.store(true);
}

std::size_t CachingAllocator::largest_free_block() const {
  std::vector<std::unique_lock<detail::ShardMutex>> locks;
  impl_->lock_all(locks);
  std::size_t largest = 0;
  // Each free set is ordered by size: its last block is its largest.
  for (Shard* shard : impl_->shards)
    for (const FreeSet* set : {&shard->small_blocks, &shard->large_blocks})
      if (!set->empty()) largest = std::max(largest, std::prev(set->end())->size);
  return largest;
}

std::vector<layout::Segment> CachingAllocator::layout(const std::function<void()>& while_locked) const {
  std::vector<std::unique_lock<detail::ShardMutex>> locks;
  impl_->lock_all(locks);
  std::vector<layout::Segment> out;
  std::lock_guard guard(impl_->segments_mutex);
  out.reserve(impl_->segments.size());
  for (const auto& [address, head] : impl_->segments) {
    // An expandable segment shows as one segment per mapped run, as PyTorch
    // reports it; its unmapped address space holds no memory.
    for (const Block* run = head; run;) {
      if (!run->mapped) {
        run = run->next;
        continue;
      }
    layout::Segment segment;
    segment.device = impl_->device->index();
    segment.stream = head->shard->stream.handle;
    segment.address = run->ptr;
    segment.large_pool = !head->small;
    segment.expandable = head->expandable != nullptr;
    segment.stack = layout::StackId{head->segment_stack};
    const Block* b = run;
    for (; b && b->mapped; b = b->next) {
      layout::Block block;
      block.address = b->ptr;
      block.size = b->size;
      block.requested = b->allocated || b->pending() ? b->requested : 0;
      block.state = b->allocated  ? layout::BlockState::active_allocated
                    : b->pending() ? layout::BlockState::active_pending_free
                                   : layout::BlockState::inactive;
      block.stack = layout::StackId{b->allocated || b->pending() ? b->stack : 0};
      segment.total_size += b->size;
      segment.blocks.push_back(block);
    }
    out.push_back(std::move(segment));
    run = b;
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
  if (while_locked) {
    // Stats read in the callback publish without taking the shard locks we hold.
    Impl::t_holds_all_locks = true;
    try {
      while_locked();
    } catch (...) {
      Impl::t_holds_all_locks = false;
      throw;
    }
    Impl::t_holds_all_locks = false;
  }
  return out;
}

}  // namespace cachealloc
