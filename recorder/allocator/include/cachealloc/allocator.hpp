// A caching device-memory allocator with PyTorch's policy.
//
// Rules (each is named in the code and tested in tests/test_allocator_*.cpp):
// - sizes round up to a multiple of 512 B (minimum 512), or to a
//   power-of-two division when roundup_power2_divisions is set;
// - requests <= 1 MiB come from the small pool, carved out of 2 MiB segments;
//   larger ones from the large pool: 20 MiB segments below 10 MiB, otherwise
//   segments of the size rounded up to 2 MiB;
// - a cached block is reused best-fit (smallest size, then lowest address) on
//   the same stream, and split when the remainder is worth keeping;
// - freed blocks merge with free neighbours;
// - a block used on other streams (record_stream) returns to its pool only
//   once events recorded on those streams have completed;
// - on a failed device reservation: release cached oversize blocks, then all
//   cached unsplit segments, retry once, then throw OutOfMemoryError.
//
// Thread safety: every member function may be called from any thread. Each
// stream has its own shard (its small and large pools, and a lock), so
// threads on different streams do not wait for each other on the cached path.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cachealloc/config.hpp"
#include "cachealloc/device.hpp"
#include "cachealloc/errors.hpp"
#include "cachealloc/events.hpp"
#include "cachealloc/layout.hpp"
#include "cachealloc/stats.hpp"

namespace cachealloc {

// One allocator event as the allocator sees it, before any recording.
struct AllocatorEvent {
  events::EventKind kind;
  Stream stream;
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t aux = 0;  // see events::EventKind for the meaning per kind
  // True when an observer may reuse the timestamp of the previous event on
  // this thread (a split before its alloc, merges after a free): both were
  // emitted inside one holding of the same shard locks, so no other thread's
  // event on that state can lie between them. False for the first event
  // after any lock is taken, and for segment_alloc and segment_map, which
  // follow a device call that may hand out an address another thread has
  // just given back.
  bool continues_call = false;
  // Order words, for an observer that timestamps events with a clock read
  // that is not ordered against the lock it runs under (a plain RDTSC may
  // execute before the lock's acquisition completes). `order` is the shard's
  // word, guarded by the shard lock the event holds; for an event of no one
  // shard (oom, empty_cache, with every shard lock held) it is the
  // allocator's word, raised first to every shard's. `order_floor`, for shard
  // events, is the allocator's word: read-only here, written only with every
  // lock held. An observer that gives each event a time above *order_floor
  // and above *order, and stores that time in *order, orders the events of
  // each shard as the allocator went through them. Either may be null (an
  // observer called by other code); then no order is implied.
  std::uint64_t* order = nullptr;
  const std::uint64_t* order_floor = nullptr;
};

// Events of one critical section of one shard (one stream, one order word):
// a split with the alloc of its front part; a free's free_requested and
// free_completed with the merges that follow. What AllocatorEvent holds
// once for all, then each event's own fields. Every event after the first
// continues the first one's call (AllocatorEvent::continues_call). Never
// an oom or empty_cache: those are reported alone, through on_event.
struct AllocatorEventBatch {
  static constexpr std::uint32_t kCapacity = 4;
  struct Item {
    events::EventKind kind;
    std::uintptr_t address;
    std::size_t size;
    std::size_t aux;
  };
  Stream stream;
  bool continues_call = false;  // the first event's
  std::uint64_t* order = nullptr;
  const std::uint64_t* order_floor = nullptr;
  std::uint32_t count = 0;
  Item items[kCapacity];  // the first `count` are the events

  AllocatorEvent event(std::uint32_t i) const noexcept {
    AllocatorEvent e{items[i].kind, stream, items[i].address, items[i].size, items[i].aux, i > 0 || continues_call};
    e.order = order;
    e.order_floor = order_floor;
    return e;
  }
};

// What every event of one shard shares: its stream and its order words
// (AllocatorEvent::order and order_floor). The allocator keeps one per
// shard, so that the cached path passes it by address.
struct AllocatorEventOrigin {
  Stream stream;
  std::uint64_t* order = nullptr;
  const std::uint64_t* order_floor = nullptr;
};

// A merge after a free (EventKind::merge): the merged block and the bytes
// of the neighbour it absorbed.
struct AllocatorMerge {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t absorbed = 0;
};

// Receives every allocator event, in order per stream, while the allocator
// holds the lock of the shard concerned. It must not call back into the
// allocator. For alloc events the returned id is kept with the block (the
// allocation site in layouts); other return values are ignored.
class AllocatorObserver {
 public:
  virtual ~AllocatorObserver() = default;
  virtual std::uint32_t on_event(const AllocatorEvent& event) noexcept = 0;
  // The events of one critical section of one shard, in the order they
  // happened (AllocatorEventBatch), in one call instead of one per event:
  // what the cached path reports. Returns the id of the alloc event among
  // them (0 when none). The default reports each through on_event.
  virtual std::uint32_t on_events(const AllocatorEventBatch& batch) noexcept {
    std::uint32_t alloc_id = 0;
    for (std::uint32_t i = 0; i < batch.count; ++i) {
      const std::uint32_t id = on_event(batch.event(i));
      if (batch.items[i].kind == events::EventKind::alloc) alloc_id = id;
    }
    return alloc_id;
  }
  // The cached path's two shapes, reported with their fields as arguments
  // instead of a batch in memory (the allocator's hottest calls). Each is
  // exactly the batch the defaults build, and an observer may rely on the
  // defaults.
  //
  // An alloc of [address, address + size) for `requested` bytes, after a
  // split that left `split_rest` bytes behind it (no split when 0). Returns
  // the alloc's id. `continues_call`: the first event's.
  virtual std::uint32_t on_alloc(const AllocatorEventOrigin& origin, bool continues_call, std::uintptr_t address,
                                 std::size_t size, std::size_t requested, std::size_t split_rest) noexcept {
    AllocatorEventBatch batch = batch_of(origin, continues_call);
    if (split_rest != 0) batch.items[batch.count++] = {events::EventKind::split, address, size, split_rest};
    batch.items[batch.count++] = {events::EventKind::alloc, address, size, requested};
    return on_events(batch);
  }
  // A free of the block at `address` (`size` bytes, `requested` asked for):
  // its free_requested first when `requested_too` (a free the caller made,
  // not one completed after stream events), then its free_completed, then
  // `merge_count` (0-2) merges.
  virtual void on_free(const AllocatorEventOrigin& origin, bool continues_call, bool requested_too,
                       std::uintptr_t address, std::size_t size, std::size_t requested, const AllocatorMerge* merges,
                       std::uint32_t merge_count) noexcept {
    AllocatorEventBatch batch = batch_of(origin, continues_call);
    if (requested_too) batch.items[batch.count++] = {events::EventKind::free_requested, address, size, requested};
    batch.items[batch.count++] = {events::EventKind::free_completed, address, size, requested};
    for (std::uint32_t i = 0; i < merge_count && batch.count < AllocatorEventBatch::kCapacity; ++i)
      batch.items[batch.count++] = {events::EventKind::merge, merges[i].address, merges[i].size, merges[i].absorbed};
    on_events(batch);
  }

 private:
  static AllocatorEventBatch batch_of(const AllocatorEventOrigin& origin, bool continues_call) noexcept {
    AllocatorEventBatch batch;
    batch.stream = origin.stream;
    batch.continues_call = continues_call;
    batch.order = origin.order;
    batch.order_floor = origin.order_floor;
    return batch;
  }
};

// A private memory pool, PyTorch's MempoolId_t: the pool a CUDA graph
// capture or a torch.cuda.MemPool allocates from. {0, 0} is the default pool.
struct PrivatePoolId {
  std::uint64_t first = 0;
  std::uint64_t second = 0;
  bool is_default() const noexcept { return first == 0 && second == 0; }
  friend auto operator<=>(PrivatePoolId, PrivatePoolId) = default;
};
// Chooses, at each allocation during begin/end_allocate_to_pool, whether the
// request on this stream goes to the private pool. Called on the allocating
// thread (PyTorch's capture filter asks cudaStreamGetCaptureInfo; MemPool's
// compares the thread).
using StreamFilter = std::function<bool(Stream)>;

// The layout of a private pool at one moment (PyTorch's PrivatePoolState),
// to put the pool back to it later: CUDA graph trees (torch.compile's
// mode="reduce-overhead") checkpoint a pool after each recording.
struct PoolCheckpoint {
  struct BlockState {
    std::uintptr_t ptr = 0;
    std::size_t size = 0;
    bool allocated = false;
  };
  struct SegmentState {
    std::vector<BlockState> blocks;  // in address order, from the segment's start
  };
  PrivatePoolId pool;
  std::vector<SegmentState> segments;
};
// What restore_pool changed: blocks that were allocated and are now free
// (their owners must not free them again), and blocks allocated again for
// the checkpoint (their new owners free them with deallocate()).
struct PoolRestore {
  std::vector<void*> freed;
  std::vector<void*> allocated;
};

enum class FreeStatus {
  ok,
  null_pointer,     // deallocate(nullptr): accepted, nothing done
  unknown_pointer,  // never returned by this allocator
  double_free,      // the start of a block that is already free
};

class CachingAllocator {
 public:
  // Uses `device` for every reservation; `config` is fixed for the
  // allocator's life.
  explicit CachingAllocator(std::shared_ptr<Device> device, AllocatorConfig config = {});
  // Waits for outstanding events and returns every segment to the device.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Returns device memory of at least `bytes` for use on `stream`.
  // Throws InvalidArgument for 0 bytes or sizes no device could hold,
  // OutOfMemoryError when the request cannot be met, DeviceError when the
  // device fails otherwise.
  void* allocate(std::size_t bytes, Stream stream = {});

  // Returns memory from allocate(). Never throws: a pointer we never
  // returned or a double free is reported on stderr and in the result, and
  // leaves the pools untouched.
  FreeStatus deallocate(void* ptr) noexcept;

  // Marks `ptr` as used on `stream`: its memory is reused only after the work
  // queued on `stream` at free time has completed. Throws InvalidArgument for
  // a pointer that is not live.
  void record_stream(void* ptr, Stream stream);

  // Returns every fully free segment to the device (after waiting for
  // outstanding stream events).
  void empty_cache();

  // With a private pool: releases that pool's whole free segments, only once
  // the pool is no longer used (use count 0), as PyTorch's emptyCache(id).
  void empty_cache(PrivatePoolId pool);

  // Private pools, as PyTorch's (CUDA graphs, MemPool). Blocks of a private
  // pool are reused only for that pool's requests, are never released while
  // the pool is in use, and take no part in garbage collection; the pool
  // uses no expandable segments. While a capture is under way no stream
  // event is queried or recorded (frees that need one wait until every
  // capture has ended), and device reservations run in relaxed capture mode.
  // Creates the pool with use count 1, or adds one use to a live pool.
  void create_or_incref_pool(PrivatePoolId pool);
  // Until end_allocate_to_pool(pool), requests on streams that `filter`
  // accepts come from `pool` (created or incref'd). Throws InvalidArgument
  // when already allocating to that pool.
  void begin_allocate_to_pool(PrivatePoolId pool, StreamFilter filter);
  // Throws InvalidArgument when not allocating to that pool.
  void end_allocate_to_pool(PrivatePoolId pool);
  // Drops one use; at 0 the pool's free segments may be released (by
  // empty_cache or an out-of-memory retry) and, once it holds none, it is gone.
  // Throws InvalidArgument for an unknown pool.
  void release_pool(PrivatePoolId pool);
  // The pool's use count; 0 for a pool that does not exist (any more).
  int pool_use_count(PrivatePoolId pool) const;
  // The pool's segments and blocks now. Throws InvalidArgument for a pool
  // that does not exist or is no longer used.
  PoolCheckpoint checkpoint_pool(PrivatePoolId pool);
  // Puts the pool's blocks back as they were at `checkpoint`: frees every
  // block allocated in the pool now, then allocates the checkpoint's blocks
  // (requested = block size, as PyTorch does) and frees again those that were
  // free. The checkpoint's segments must still be the pool's. Throws
  // InvalidArgument when the pool cannot be put back (unknown pool, a
  // segment gone, a block still waiting for stream events).
  PoolRestore restore_pool(const PoolCheckpoint& checkpoint);
  // The private pool of each segment that belongs to one, by the segment's
  // address (layout()'s segments of the default pool are not listed).
  std::map<std::uintptr_t, PrivatePoolId> private_segments() const;

  // Caps reserved memory at fraction x device total. Throws InvalidArgument
  // outside [0, 1].
  void set_memory_fraction(double fraction);

  std::size_t memory_allocated() const;
  std::size_t memory_reserved() const;
  std::size_t max_memory_allocated() const;
  std::size_t max_memory_reserved() const;
  void reset_peak_stats();
  void reset_accumulated_stats();
  MemoryStats stats() const;
  std::map<std::string, std::int64_t> memory_stats() const { return stats().to_map(); }
  std::string memory_summary() const { return format_summary(stats()); }

  // Every segment with its blocks, sorted by address. Takes every shard lock
  // briefly. `while_locked`, when given, runs while every shard lock is still
  // held: no allocator event and no stats change can happen during it, so
  // what it reads (stats, an observer's event count) describes the same
  // moment as the layout. It must not call back into the allocator.
  std::vector<layout::Segment> layout(const std::function<void()>& while_locked = {}) const;
  // The largest cached free block, in bytes (mapped memory that no request
  // holds and no stream event waits on), 0 when none: layout()'s largest
  // inactive block, without building the layout. Takes every shard lock
  // briefly; O(pools), no heap allocation beyond the lock list.
  std::size_t largest_free_block() const;

  // Installs (or, with nullptr, removes) the event observer. The observer
  // must outlive its installation.
  void set_observer(AllocatorObserver* observer) noexcept;

  const AllocatorConfig& config() const noexcept;
  Device& device() noexcept;
  // The cap in bytes, 0 when no memory fraction is set.
  std::size_t memory_cap() const noexcept;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace cachealloc
