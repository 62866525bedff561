// Internals of CachingAllocator, shared by the fast path (allocator.cpp) and
// the slow path (allocator_slow.cpp).
//
// Locking, outermost first:
//   registry_mutex_   held by the slow path (device OOM handling, garbage
//                     collection, empty_cache, layout) and by shard creation;
//   Shard::mutex      one per stream; the slow path takes all of them in
//                     ascending stream order; the fast path exactly one,
//                     after, while other streams' frees wait for events,
//                     each of those shards in turn under registry_mutex
//                     (process_other_shards; its flush_deferred may take
//                     g_live_mutex and another allocator's shard lock);
//   segments_mutex_, stats_lock_, the segment index's mutex, captures_mutex:
//                     leaves, held for a few instructions and never while
//                     taking another lock (begin_allocate_to_pool releases
//                     captures_mutex before it takes every lock once).
// An event is queried only under its shard's lock, after reading
// captures_underway there: begin_allocate_to_pool stores it, then takes
// each lock once, so no query follows its return.
// The cached path takes its shard's lock alone: the shard's live blocks are in
// its own table (Shard::live), and a free finds the shard through a lock-free
// segment index (segment_index.hpp).
#pragma once

#include <boost/intrusive/set.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <vector>

#include "cachealloc/allocator.hpp"
#include "cachealloc/policy.hpp"
#include "free_set.hpp"
#include "pointer_map.hpp"
#include "segment_index.hpp"
#include "cachealloc/detail/spinlock.hpp"

namespace cachealloc {

// The large pool's free-set bins: 4,096 of them cover blocks up to 256 MiB.
inline constexpr std::size_t kLargeBinWidth = 64u << 10;
// Larger requests than this are refused as impossible rather than tried.
inline constexpr std::size_t kMaxRequest = std::size_t{1} << 56;

struct Shard;

// The address range of one expandable segment: reserved once, with memory
// mapped into it in chunks (2 MiB small pool, 20 MiB large pool) as needed.
struct ExpandableSegment {
  std::uintptr_t ptr = 0;
  std::size_t size = 0;   // reserved address space
  std::size_t chunk = 0;  // mapping granularity
  std::size_t mapped = 0; // bytes mapped now
  std::size_t chunk_index(std::uintptr_t address) const noexcept { return (address - ptr) / chunk; }
};

// Two cache lines, aligned. The first holds what a best-fit search and a
// merge read: the tree hook, size and address, the neighbours and the flags;
// the second what only the block's own alloc or free touches. At 144 bytes,
// unaligned, a tree walk touched two or three lines per node.
struct alignas(64) Block {
  using FreeHook = boost::intrusive::set_member_hook<boost::intrusive::link_mode<boost::intrusive::normal_link>,
                                                     boost::intrusive::optimize_size<true>>;
  FreeHook free_hook;  // 24 bytes: the colour lives in the parent pointer's low bit
  std::uintptr_t ptr = 0;
  std::size_t size = 0;
  Block* prev = nullptr;      // neighbours within the segment
  Block* next = nullptr;
  int event_count = 0;        // outstanding cross-stream events
  bool small = false;         // small pool (else large)
  bool allocated = false;
  bool mapped = true;         // false: expandable address range with no memory
  // --- second line ---
  Shard* shard = nullptr;     // owning shard
  std::size_t requested = 0;  // bytes asked for, while allocated or pending
  ExpandableSegment* expandable = nullptr;
  std::vector<Stream> stream_uses;  // streams from record_stream
  std::size_t gc_count_base = 0;    // pool's get_free_block count when cached
  std::uint32_t stack = 0;          // allocation site from the observer
  std::uint32_t segment_stack = 0;  // site of the segment allocation (head block only)

  bool is_split() const noexcept { return prev != nullptr || next != nullptr; }
  bool pending() const noexcept { return !allocated && event_count > 0; }
  // As new, keeping stream_uses' capacity: a recycled block on the cached
  // path (a merge) pays neither a vector move nor a free.
  void reset() noexcept {
    ptr = 0;
    size = requested = 0;
    prev = next = nullptr;
    shard = nullptr;
    small = allocated = false;
    mapped = true;
    expandable = nullptr;
    event_count = 0;
    stream_uses.clear();
    gc_count_base = 0;
    stack = segment_stack = 0;
  }
};
// reset() names every field: a new one must be added there.
static_assert(sizeof(void*) != 8 || sizeof(Block) == 128, "a field was added to Block: reset() must reset it");
static_assert(sizeof(void*) != 8 || offsetof(Block, shard) == 64, "the first line holds what a search reads");

// Cached blocks of one pool of one stream, ordered by size, then address:
// lower_bound(size) is best fit.
struct BlockBySize {
  bool operator()(const Block& a, const Block& b) const noexcept {
    return a.size != b.size ? a.size < b.size : a.ptr < b.ptr;
  }
};
struct SizeKey {
  bool operator()(std::size_t size, const Block& b) const noexcept { return size < b.size || (size == b.size && 0 < b.ptr); }
  bool operator()(const Block& b, std::size_t size) const noexcept { return b.size < size; }
};
using SizeTree = boost::intrusive::multiset<
    Block, boost::intrusive::member_hook<Block, decltype(Block::free_hook), &Block::free_hook>,
    boost::intrusive::compare<BlockBySize>, boost::intrusive::constant_time_size<false>>;
// Both pools' sets bin by size, the small pool's in exact 512 B bins, the
// large pool's in 64 KiB bins; both in (size, address) order: see
// free_set.hpp.
using FreeSet = BinnedFreeSet<SizeTree>;
// Unmapped ranges of expandable segments, by address. A block is in a
// FreeSet or an UnmappedSet, never both, so they share the hook.
struct BlockByAddress {
  bool operator()(const Block& a, const Block& b) const noexcept { return a.ptr < b.ptr; }
};
using UnmappedSet = boost::intrusive::multiset<
    Block, boost::intrusive::member_hook<Block, decltype(Block::free_hook), &Block::free_hook>,
    boost::intrusive::compare<BlockByAddress>, boost::intrusive::constant_time_size<true>>;

// A change to one Stat not yet folded into the allocator-wide stats: the net
// change, the highest the running net change reached (for the peak), and
// the cumulative increases. The cumulative decreases are up - net, so a
// decrease is one subtraction.
struct StatDelta {
  std::int64_t net = 0, high = 0, up = 0;
  // Branch-free: the peak and the sign of a change follow the request
  // sizes, which no predictor learns (the mixed workload).
  void increase(std::int64_t amount) noexcept {
    net += amount;
    up += amount;
    high = net > high ? net : high;
  }
  void decrease(std::int64_t amount) noexcept {
    net -= amount;
  }
  // Either sign.
  void change(std::int64_t amount) noexcept {
    net += amount;
    up += amount > 0 ? amount : 0;
    high = net > high ? net : high;
  }
  void fold_into(Stat& stat) noexcept {
    // An untouched stat leaves its cache line of the shared figures alone
    // (amounts are never negative: with no increase, no net change means
    // every decrease was 0).
    if ((up | net) == 0) return;
    if (stat.current + high > stat.peak) stat.peak = stat.current + high;
    stat.current += net;
    stat.allocated += up;
    stat.freed += up - net;
    *this = StatDelta{};
  }
};
using StatDeltaArray = std::array<StatDelta, kStatTypes>;

// Stats changes a stream's shard made since they were last published, with
// the same names as MemoryStats. Threads working on different streams thus
// write no shared cache line per operation; see CachingAllocator::Impl::publish.
struct PendingStats {
  StatDeltaArray allocation, segment, active, inactive_split, allocated_bytes, reserved_bytes, active_bytes,
      inactive_split_bytes, requested_bytes;
  StatDelta oversize_allocations, oversize_segments;
  std::int64_t num_alloc_retries = 0, num_device_alloc = 0, num_device_free = 0;
  std::uint32_t operations = 0;  // since the last publish

  void fold_into(MemoryStats& stats) noexcept {
    StatDeltaArray* mine[] = {&allocation, &segment, &active, &inactive_split, &allocated_bytes,
                              &reserved_bytes, &active_bytes, &inactive_split_bytes, &requested_bytes};
    StatArray* theirs[] = {&stats.allocation, &stats.segment, &stats.active, &stats.inactive_split,
                           &stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes,
                           &stats.inactive_split_bytes, &stats.requested_bytes};
    for (std::size_t i = 0; i < std::size(mine); ++i)
      for (std::size_t t = 0; t < kStatTypes; ++t) (*mine[i])[t].fold_into((*theirs[i])[t]);
    oversize_allocations.fold_into(stats.oversize_allocations);
    oversize_segments.fold_into(stats.oversize_segments);
    if ((num_alloc_retries | num_device_alloc | num_device_free) != 0) {
      stats.num_alloc_retries += num_alloc_retries;
      stats.num_device_alloc += num_device_alloc;
      stats.num_device_free += num_device_free;
      num_alloc_retries = num_device_alloc = num_device_free = 0;
    }
    operations = 0;
  }
};

// The shard a thread last changed, and in which allocator (its generation).
struct ThreadPending {
  std::uint64_t allocator = 0;
  Shard* shard = nullptr;
};

// The default-pool shard a thread last allocated from (see Impl::t_shard).
struct ThreadShard {
  std::uint64_t allocator = 0;
  std::uintptr_t stream = 0;
  Shard* shard = nullptr;
};

struct PendingFree {
  DeviceEvent event;
  Block* block;
};

// Everything that belongs to one stream of one pool (the default pool, or
// a private pool of a CUDA graph or MemPool).
// Aligned to a cache line: shards of threads on different streams never
// share one.
struct alignas(64) Shard {
  Shard(Stream s, PrivatePoolId p) : stream(s), private_pool(p) {}
  Stream stream;
  PrivatePoolId private_pool;
  detail::ShardMutex mutex;
  FreeSet small_blocks{kMinBlockSize};
  FreeSet large_blocks{kLargeBinWidth};
  // Outstanding events per stream they were recorded on, oldest first.
  std::map<Stream, std::deque<PendingFree>> pending;
  // Whether `pending` holds any, for other shards' requests to read without
  // this lock (Impl::shards_with_pending counts the shards where it is set).
  std::atomic<bool> has_pending{false};
  std::vector<DeviceEvent> spare_events;
  // The observer's order word for this shard (AllocatorEvent::order), under
  // `mutex`: on the same cache line as the lock the event holds.
  std::uint64_t event_order = 0;
  std::vector<Block*> spare_blocks;  // recycled Block objects: no heap allocation per split
  detail::PointerMap<Block> live;    // this shard's allocated blocks by address
  PendingStats unpublished;          // stats changes not yet published
  // Freed blocks used on other streams whose events could not be recorded
  // because a capture was under way (PyTorch's
  // needs_events_deferred_until_no_capture).
  std::vector<Block*> deferred_events;

  UnmappedSet small_unmapped;
  UnmappedSet large_unmapped;
  // This shard's stream and order words, for the observer: last, so that
  // the fields the cached path touches keep their cache lines.
  AllocatorEventOrigin origin;

  FreeSet& pool(bool small_pool) noexcept { return small_pool ? small_blocks : large_blocks; }
  UnmappedSet& unmapped(bool small_pool) noexcept { return small_pool ? small_unmapped : large_unmapped; }
};

struct CachingAllocator::Impl {
  Impl(std::shared_ptr<Device> device, AllocatorConfig config);
  ~Impl();

  // --- fast path (allocator.cpp) ---
  void* allocate(std::size_t bytes, Stream stream);
  FreeStatus deallocate(void* ptr) noexcept;
  void record_stream(void* ptr, Stream stream);

  std::size_t round_size(std::size_t size) const noexcept;
  static std::size_t allocation_size(std::size_t size) noexcept;
  Shard& shard_for(Stream stream, PrivatePoolId pool = {});
  // The private pool a capture under way takes this stream's requests to,
  // else the default pool.
  PrivatePoolId capture_pool(Stream stream);
  bool capturing() const noexcept { return captures_underway.load(std::memory_order_acquire) != 0; }
  // Records the deferred events of every shard (every shard lock held).
  void insert_deferred_events();
  Block* get_free_block(Shard& shard, bool small, std::size_t size, bool count_for_gc);
  bool should_split(const Block& block, std::size_t size) const noexcept;
  // split: -1 by the policy (should_split), 0 never, 1 whenever space is left
  // (restore_pool recreates the checkpoint's splits whatever the policy says).
  void* hand_out(Shard& shard, Block* block, std::size_t size, std::size_t requested, int split = -1);
  void process_events(Shard& shard);
  // Whether a deferred free of `shard` is ready: its queues' first events
  // (process_events would complete at least one). Needs the shard's lock.
  bool events_ready(Shard& shard);
  // PyTorch completes every stream's deferred frees at each request, not
  // only those of the requesting stream's pool: a request first completes
  // those of the other shards (each under its own lock, none held here).
  void process_other_shards(const Shard& own);
  // Keeps has_pending and shards_with_pending in step with shard.pending
  // (under the shard's lock), after each change to it.
  void note_pending(Shard& shard) noexcept;
  void insert_events(Block* block);
  // Returns a block whose last user is done to its pool, merging neighbours.
  // With also_release_allocation, also does release_allocation_stats under
  // the same stats lock (the common free with no stream events).
  // Reports the block's free_completed and merges in one observer call
  // (AllocatorObserver::on_free), after its free_requested when
  // `requested_too` (the caller's own free, in the same critical section).
  void free_block(Block* block, bool also_release_allocation, bool requested_too = false);
  void release_allocation_stats(const Block& block);
  Block* try_merge(Block* dst, Block* src);
  void cache(Block* block);
  Block* new_block(Shard& shard);
  void recycle(Block* block);
  bool gc_active() const noexcept {
    return fraction_set_.load(std::memory_order_relaxed) && config.garbage_collection_threshold > 0.0;
  }
  // Events emitted on this thread since it last took a shard lock (or
  // entered a public call). initial-exec: a plain %fs-relative access, not
  // a __tls_get_addr call. begin_call() runs at every public entry and
  // after every acquisition of shard locks, so that the first event of each
  // critical section reads the clock afresh: a timestamp read under one lock
  // and reused under another could precede another thread's event on the
  // second lock's state, and the dump, which sorts by time, would then put
  // the events in an order the allocator never went through.
  static inline thread_local std::uint32_t t_call_events __attribute__((tls_model("initial-exec"))) = 0;
  static void begin_call() noexcept { t_call_events = 0; }
  // An event of one shard, under its lock: the observer gets the shard's
  // order word and the allocator's (AllocatorEvent::order).
  std::uint32_t emit(Shard& shard, events::EventKind kind, std::uintptr_t address, std::size_t size,
                     std::size_t aux) noexcept {
    AllocatorObserver* o = observer.load(std::memory_order_acquire);
    if (!o) return 0;
    return o->on_event(pool_event(shard, kind, address, size, aux));
  }
  AllocatorEvent pool_event(Shard& shard, events::EventKind kind, std::uintptr_t address, std::size_t size,
                            std::size_t aux) noexcept {
    AllocatorEvent event{kind, shard.stream, address, size, aux, continues_call(kind)};
    event.order = &shard.event_order;
    event.order_floor = &event_order_all;
    return event;
  }
  // An event of no one shard (oom, empty_cache), with every shard lock held:
  // the allocator's order word is first raised to every shard's, so that the
  // event is ordered after each shard's last.
  std::uint32_t emit_global(events::EventKind kind, Stream stream, std::uintptr_t address, std::size_t size,
                            std::size_t aux) noexcept {
    AllocatorObserver* o = observer.load(std::memory_order_acquire);
    if (!o) return 0;
    for (const Shard* shard : shards) event_order_all = std::max(event_order_all, shard->event_order);
    AllocatorEvent event{kind, stream, address, size, aux, continues_call(kind)};
    event.order = &event_order_all;
    return o->on_event(event);
  }
  static bool continues_call(events::EventKind kind) noexcept {
    // A new segment or mapping follows a device call that may return an
    // address another thread released after this section's first event.
    const bool after_device_call =
        kind == events::EventKind::segment_alloc || kind == events::EventKind::segment_map;
    return t_call_events++ > 0 && !after_device_call;
  }

  // --- slow path (allocator_slow.cpp) ---
  // `size` is the rounded request; the segment is allocation_size(size), or,
  // with expandable segments, just enough mapped memory for `size`.
  Block* reserve_segment(Shard& shard, bool small, std::size_t size, bool is_retry);
  void* allocate_slow(Shard& shard, std::size_t size, std::size_t requested, bool device_tried);
  void garbage_collect();
  bool release_available_cached_blocks(Shard& shard, bool small, std::size_t size);
  // PyTorch's release_cached_blocks(mempool_id): the default pool's whole
  // free segments and those of private pools no longer used (all of them
  // for the default id, else only that pool's).
  void release_cached_blocks(PrivatePoolId which = {});
  // Waits for pending frees and frees their blocks: every shard's, or only one private pool's.
  void synchronize_and_free_events(std::optional<PrivatePoolId> only = std::nullopt);
  void release_block(Block* block);
  std::size_t release_unsplit(FreeSet& set);

  // --- expandable segments (allocator_expandable.cpp) ---
  Block* allocate_expandable(Shard& shard, bool small, std::size_t size);
  Block* find_expandable_block(Shard& shard, bool small, std::size_t size);
  Block* map_block(Block* to_map, std::size_t size);
  void unmap_block(Block* block);
  void release_expandable_segment(Block* block);
  void release_expandable(std::vector<Block*>& blocks);
  [[noreturn]] void throw_out_of_memory(Stream stream, std::size_t requested);
  std::vector<Shard*> lock_all(std::vector<std::unique_lock<detail::ShardMutex>>& locks);
  Block* find_free_block_at(std::uintptr_t address);

  std::shared_ptr<Device> device;
  const AllocatorConfig config;
  // Any roundup_power2_divisions set: else round_size skips their look-up.
  const bool roundup_configured;
  std::atomic<AllocatorObserver*> observer{nullptr};

  // Shards: a lock-free lookup table written only under registry_mutex_, plus
  // the list sorted by stream for the slow path.
  static constexpr std::size_t kShardSlots = 1024;
  std::array<std::atomic<Shard*>, kShardSlots> shard_table{};
  std::vector<Shard*> shards;  // sorted by (stream handle, private pool)
  std::atomic<std::uint32_t> shards_with_pending{0};  // shards whose deferred frees wait for events
  detail::ShardMutex registry_mutex;  // in lock_all's vector with the shard locks

  // Private pools by id, with their use counts; under registry_mutex.
  std::map<PrivatePoolId, int> private_pools;
  // Captures under way: the pool and filter of each, in the order begun
  // (the first whose filter accepts a stream wins). captures_mutex is a
  // leaf; captures_underway is its size, read without the lock.
  std::mutex captures_mutex;
  std::vector<std::pair<PrivatePoolId, StreamFilter>> captures;
  std::atomic<int> captures_underway{0};
  std::atomic<std::size_t> deferred_event_blocks{0};

  // The shard that owns each segment's memory, for frees (lock-free reads).
  detail::SegmentIndex<Shard> owners;

  std::mutex segments_mutex;
  std::map<std::uintptr_t, Block*> segments;  // head block of every segment
  std::vector<std::unique_ptr<ExpandableSegment>> expandable_segments;  // under segments_mutex

  // PyTorch's total_allocated_memory: bytes reserved from the device. Kept
  // apart from the stats so the cap can be charged with one CAS.
  std::atomic<std::size_t> total_reserved{0};
  std::atomic<bool> fraction_set_{false};
  std::atomic<std::size_t> allowed_memory_maximum{0};
  std::size_t device_total = 0;

  // Per pool kind (0 large, 1 small): get_free_block calls while garbage
  // collection is active; a cached block's age is the count since it was cached.
  std::atomic<std::size_t> free_block_calls[2] = {0, 0};

  // Publishing. Every stats change goes to the pending stats of the shard
  // concerned, under its lock, in order, and is folded into the shared
  // `stats` later: a StatDelta folds any run of changes exactly (its `high`
  // is the peak of the run). A shard folds
  //   - when a reader asks: readers publish every shard first, so every
  //     figure a reader sees is exact;
  //   - when the thread that last changed it goes to another shard
  //     (flush_deferred, before that thread takes the other shard's lock, so
  //     no lock is held while taking this one): a thread thus has changes
  //     pending in one shard at most, and its own calls fold in the order it
  //     made them, which keeps PyTorch's peaks for a single thread on many
  //     streams (test_allocator_streams);
  //   - every kPublishBatch operations, so that pending figures stay recent.
  // Concurrent threads' operations then count as if each run folded ran at
  // once, one of the orders the program could have run in.
  //
  // Nothing shared is read or written on a call but at a fold, and a fold at
  // a batch's end uses try_lock: when another thread is folding, it goes on
  // and tries again at its next operation (waiting only at
  // kPublishBatchLimit). With 16 threads a fold pulls its lines of `stats`
  // from another core; also storing a shared `last_publisher` at every fold
  // and reading it on every call left 16 threads at 5-9x one thread's cost
  // per pair on the H200's host.
  static constexpr std::uint32_t kPublishBatch = 1024;
  static constexpr std::uint32_t kPublishBatchLimit = 4 * kPublishBatch;
  void maybe_publish(Shard& shard) noexcept;
  void publish(Shard& shard) noexcept;  // needs the shard's lock
  void publish_all_locked() noexcept;  // every shard lock is held
  void publish_all();                  // takes each shard lock in turn
  // The default-pool shard this thread last allocated from, by allocator and
  // stream: the next request on that stream skips shard_for's look-up.
  // Pools live as long as their allocator, whose generation is never reused.
  static inline thread_local ThreadShard t_shard __attribute__((tls_model("initial-exec")));
  // The shard this thread last changed (its changes may still be pending).
  static inline thread_local ThreadPending t_pending __attribute__((tls_model("initial-exec")));
  // Publishes the shard this thread left pending when it is not `next`.
  // Takes that shard's lock: call with no shard lock held.
  void flush_deferred(const Shard& next) noexcept {
    Shard* const waiting = t_pending.shard;
    if (waiting == &next || waiting == nullptr) [[likely]]
      return;
    flush_deferred_slow();
  }
  void flush_deferred_slow() noexcept;
  MemoryStats read_stats() const;
  static inline thread_local bool t_holds_all_locks __attribute__((tls_model("initial-exec"))) = false;
  // Process-unique, never reused: names this allocator in t_pending.
  static std::uint64_t register_live(Impl* impl);
  void unregister_live() noexcept;
  const std::uint64_t generation;

  // The observer's order word for events of no one shard, and the floor of
  // every shard's (AllocatorEvent::order_floor): written only with every
  // shard lock held, read under any one. A line of its own, read-shared.
  alignas(64) std::uint64_t event_order_all = 0;

  alignas(64) mutable detail::Spinlock stats_lock;
  MemoryStats stats;  // published figures, under stats_lock
};

// The cached path's small steps, here so that every file of the allocator
// inlines them (out of line they were a quarter of a cached pair's calls).
inline Block* CachingAllocator::Impl::new_block(Shard& shard) {
  if (shard.spare_blocks.empty()) return new Block;
  Block* block = shard.spare_blocks.back();
  shard.spare_blocks.pop_back();
  return block;
}

inline void CachingAllocator::Impl::recycle(Block* block) {
  Shard& shard = *block->shard;
  block->reset();
  shard.spare_blocks.push_back(block);
}

inline void CachingAllocator::Impl::cache(Block* block) {
  block->gc_count_base = free_block_calls[block->small].load(std::memory_order_relaxed);
  block->shard->pool(block->small).insert(*block);
}

// Rule: the small pool splits when at least 512 B remain; the large pool
// when more than 1 MiB remains and the request is below max_split_size.
inline bool CachingAllocator::Impl::should_split(const Block& block, std::size_t size) const noexcept {
  const std::size_t remaining = block.size - size;
  if (block.small || config.expandable_segments) return remaining >= kMinBlockSize;
  return size < config.max_split_size && remaining > kSmallSize;
}

// Rule: best fit on the same stream; oversize blocks (>= max_split_size) serve
// only requests that are themselves oversize and within
// max_non_split_rounding of the block's size.
inline Block* CachingAllocator::Impl::get_free_block(Shard& shard, bool small, std::size_t size, bool count_for_gc) {
  if (count_for_gc && gc_active()) free_block_calls[small].fetch_add(1, std::memory_order_relaxed);
  FreeSet& pool = shard.pool(small);
  auto it = pool.lower_bound(size, SizeKey{});
  if (it == pool.end()) return nullptr;
  if (it->expandable) {
    // Rule (expandable segments): a block at the end of a segment's mapped
    // part counts as large as it could grow, so best fit prefers later blocks
    // that would fit more snugly.
    auto expandable_size = [](const Block& b) { return b.size + (b.next && !b.next->mapped ? b.next->size : 0); };
    for (auto next = std::next(it); it->expandable && next != pool.end() && expandable_size(*next) < expandable_size(*it);
         ++next)
      it = next;
  }
  const std::size_t max_split = config.max_split_size;
  if (size < max_split && it->size >= max_split) return nullptr;
  if (size >= max_split && it->size >= size + config.max_non_split_rounding) return nullptr;
  Block* block = &*it;
  pool.erase(it);
  return block;
}

// Merges `src` into `dst` when src is a free, settled neighbour. Returns the
// surviving block (the lower-addressed one), or nullptr when no merge happened.
inline Block* CachingAllocator::Impl::try_merge(Block* dst, Block* src) {
  if (!src || src->allocated || src->event_count > 0 || !src->stream_uses.empty() || src->mapped != dst->mapped)
    return nullptr;
  Shard& shard = *dst->shard;
  if (src->mapped)
    shard.pool(src->small).erase(FreeSet::s_iterator_to(*src));
  else
    shard.unmapped(src->small).erase(UnmappedSet::s_iterator_to(*src));
  Block* low = dst->prev == src ? src : dst;
  Block* high = low == src ? dst : src;
  // `low` survives so that a segment's head block object never changes.
  low->size += high->size;
  low->next = high->next;
  if (low->next) low->next->prev = low;
  low->requested = dst->requested;
  low->stack = dst->stack;
  if (low == src) {
    low->allocated = dst->allocated;
    low->event_count = dst->event_count;
  }
  recycle(high);
  return low;
}

}  // namespace cachealloc
