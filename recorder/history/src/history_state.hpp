// The state behind HistoryRecorder, shared by the files that each hold one of
// its concerns: recording.cpp (the hot path), ring.cpp, annotations.cpp,
// oom_dump.cpp, history_lifecycle.cpp, history_options.cpp and
// history_dump.cpp (snapshots).
// Private to the recorder library.
#pragma once

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <memory>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cachealloc/device.hpp"
#include "cachealloc/history.hpp"
#include "cachealloc/detail/spinlock.hpp"
#include "clock.hpp"
#include "event_records.hpp"
#include "stack_capture.hpp"
#include "thread_registry.hpp"

namespace cachealloc {

// A fixed block of event records (event_records.hpp). Each thread fills its
// own staging chunk in place, without any lock; it stays hot in the thread's
// cache. When it is full the thread copies it into the ring (a ring of
// chunks, the oldest one evicted) with non-temporal stores, which neither
// read the ring's cold memory first nor evict the thread's working set, then
// starts over. The ring lock is taken once per chunk.
//
// Records hold neither `device` (the recorder's) nor `thread` (a chunk
// holds one thread's events; Chunk::thread names it, and the flush carries
// it into the ring). Only the annotation chunk, which mixes threads, gives
// each record a thread word (kThreadInEvents). The dump fills both in.
struct Chunk {
  static constexpr std::uint32_t kWords = 2048;  // 16 KiB
  // Fewest events a full chunk holds: what sizes the ring for max_entries.
  static constexpr std::uint32_t kMinEvents = (kWords - detail::kMaxBatchWords + 1) / detail::kMaxWordsPerEvent;
  static constexpr std::uint32_t kThreadInEvents = ~std::uint32_t{0};
  alignas(64) std::uint64_t words[kWords];
  std::uint32_t used = 0;                 // words written
  std::atomic<std::uint32_t> count{0};    // events (a compound record holds two); atomic only so that counters may be read racily
  std::uint32_t thread = kThreadInEvents;  // whose events these are
  std::uint64_t base_ticks = 0;           // record times are offsets from this
  std::uint64_t newest_ticks = 0;         // the newest time in the chunk
  std::uint64_t sequence = 0;             // a stream's queue order (State::stream_sequence)
  // A ring chunk a thread is copying into outside ring_lock (flush). Set
  // and cleared by that thread; a flush that would reuse the chunk (the
  // ring went round during the copy) waits for it under ring_lock.
  std::atomic<bool> busy{false};

  bool empty() const noexcept { return used == 0; }
  void clear() noexcept {
    used = 0;
    count.store(0, std::memory_order_relaxed);
  }
};

// One thread's staging chunk. Only its owner writes it, and only inside
// on_event, which runs under a shard lock; a dump reads it inside
// CachingAllocator::layout()'s hook, where every shard lock is held, and
// start() resets it there too.
struct ThreadSlot {
  Chunk staging;
  std::uint32_t thread = 0;  // the owner's detail::thread_index()
  // The stream of the chunk's last stream record; valid while the chunk is
  // not empty (an empty chunk starts with a stream record).
  std::uint64_t stream = 0;
  // Where the chunk's last event record starts, for folding the next event
  // of the same call into it (a split and its alloc, a free's two halves);
  // kNoRecord when that record may not be extended.
  static constexpr std::uint32_t kNoRecord = ~std::uint32_t{0};
  std::uint32_t last_record = kNoRecord;
  // The owner's last interned stacks, ids of this recorder's table only
  // (the slot belongs to one recorder). start() clears it, under layout().
  detail::StackCache stacks;
};

class StreamRecorder;

struct HistoryRecorder::State {
  explicit State(CachingAllocator& a);

  // Streaming (stream_recorder.cpp): the staging chunk goes to the writer's
  // queue instead of the ring, waiting or dropping when it is full.
  void flush_to_stream(ThreadSlot& slot) noexcept;
  void flush_to_stream_locked(ThreadSlot& slot) noexcept;  // needs ring_lock; never waits
  // Moves a thread's full staging chunk into the ring. Takes ring_lock only
  // to claim the ring chunk, and copies outside it: the caller holds a pool
  // lock, so no dump or restart (which hold every shard lock) runs meanwhile,
  // and threads copy at once instead of in turn. Must not hold ring_lock.
  void flush(ThreadSlot& slot) noexcept;
  // The same with ring_lock held throughout (annotations, which run outside
  // the allocator's locks). Needs ring_lock.
  void flush_locked(ThreadSlot& slot) noexcept;
  // The ring chunk the next `count` events go to, marked busy, with the
  // evicted chunk's events counted; nullptr (recording switched off) when
  // no chunk can be allocated. Needs ring_lock.
  Chunk* claim_locked(ThreadSlot& slot) noexcept;
  // Chunks the ring may hold for max_entries. Needs ring_lock.
  std::size_t ring_capacity_locked() const noexcept;
  // Appends one event outside the allocator's locks (annotations: rare).
  void append_direct(const snapshot::Event& event) noexcept;
  // Records one allocator event in the calling thread's slot (on_event's
  // and on_events' body).
  std::uint32_t record(ThreadSlot& slot, const AllocatorEvent& event) noexcept;
  // record()'s parts, shared with on_events: the event's time (and its
  // order word's update), room in the chunk with the stream record, the
  // interned stack.
  std::uint64_t event_time(const AllocatorEvent& event) noexcept;
  std::uint64_t event_time(bool continues_call, bool after_device_call, std::uint64_t* order,
                           const std::uint64_t* order_floor) noexcept;
  void make_room(ThreadSlot& slot, std::uint64_t t, std::uint64_t stream, std::uint32_t words) noexcept;
  std::uint32_t capture_stack(ThreadSlot& slot, StackCapture capture) noexcept;
  // This thread's slot, created on its first event; nullptr when out of memory.
  ThreadSlot* slot() noexcept;
  ThreadSlot* new_slot() noexcept;  // slot()'s slow path
  // Annotation names; ids are those of the snapshot's string table.
  std::uint32_t string_id(std::string_view text);
  void request_oom_dump() noexcept;
  void record_oom_usage(std::uint32_t thread, std::uint64_t at_ticks) noexcept;

  CachingAllocator& allocator;
  const std::uint64_t id;  // process-unique, keys the per-thread slot cache
  std::int32_t device = 0;
  const bool use_tsc;  // whether the precise clock is the TSC, fixed for the recorder's life
  // The tick source of the current recording: set by start() while every
  // shard lock is held, read by the hot path under one (and, racily but
  // harmlessly, by annotations).
  std::atomic<detail::TickSource> ticks{detail::TickSource::monotonic};
  detail::TickSource tick_source() const noexcept { return ticks.load(std::memory_order_relaxed); }

  // Read on the hot path, written only by start/stop/deactivate and a dump:
  // cache lines of their own, away from ring_lock and the flush state that
  // every thread writes once per chunk.
  alignas(64) std::atomic<bool> recording{false};
  // Frames the last take_snapshot() could not symbolize (the symbolizer
  // threw); dump_snapshot() then switches recording off, with one line.
  mutable std::atomic<std::uint64_t> symbolization_failures{0};
  // Switches recording off from inside an allocator call (under its shard
  // lock, where stop() would deadlock): on_event drops every event after it.
  // Prints `why` on stderr, one line, once per start().
  void deactivate(const char* why) noexcept;
  std::atomic<bool> deactivated{false};
  std::atomic<StackCapture> stacks{StackCapture::none};
  std::atomic<std::uint32_t> max_frames{32};
  std::atomic<bool> stacks_on_free{false};

  // Lock order, outermost first; a thread holding one lock only ever takes
  // locks further down this list:
  //   1. control                    start/stop and options
  //   2. the allocator's shard locks  (on_event runs under one; layout() takes all)
  //   3. oom_mutex, ring_lock, strings_mutex, usage_mutex, the stack table's shards and
  //      detail's thread registry: leaves, never held while taking another.
  // The OOM-dump thread therefore never reads `options` (control) while it
  // holds oom_mutex: the path it needs is copied into oom_dump_path.
  mutable std::mutex control;  // start/stop and options
  HistoryOptions options;

  // Everything below is guarded by ring_lock.
  alignas(64) mutable detail::Spinlock ring_lock;
  std::vector<std::unique_ptr<Chunk>> chunks;       // owns every chunk
  std::vector<std::unique_ptr<ThreadSlot>> slots;   // one per thread that recorded
  std::unique_ptr<ThreadSlot> annotation_slot = std::make_unique<ThreadSlot>();  // events from append_direct
  std::vector<Chunk*> ring;                         // full chunks, oldest at ring[next % size]
  std::vector<Chunk*> spare;                        // empty chunks
  std::uint64_t next = 0;                           // chunks pushed into the ring
  std::uint64_t max_entries = 0;
  std::uint64_t evicted = 0;         // events in chunks the ring let go
  std::uint64_t newest_dropped = 0;  // ticks of the newest event evicted
  detail::TickAnchor anchor;         // taken at start()

  detail::StackTable table;

  // Streaming (HistoryOptions::stream). While `streaming`, `ring` is the
  // writer's queue (oldest first) and never evicts. The chunks in use
  // (queued or being written) stay within stream_chunk_limit, or
  // stream_chunk_limit + kStreamReserveChunks while the writer takes every
  // shard lock for a cut (a thread that waited there would block the cut);
  // past the reserve a chunk is spilled to disk (StreamSpill). Guarded by
  // ring_lock.
  static constexpr std::size_t kStreamReserveChunks = 64;
  bool streaming = false;
  bool stream_drop = false;
  std::size_t stream_chunk_limit = 0;
  std::size_t stream_peak_chunks = 0;
  std::uint64_t streamed = 0;       // events the writer took from the queue
  std::uint64_t stream_waits = 0;
  // Numbers the chunks a stream queues or spills (StreamSpill): a thread's
  // pieces, in this order, are in time order.
  std::uint64_t stream_sequence = 0;
  std::uint64_t stream_spilled = 0;  // events spilled, not yet taken by a cut
  std::atomic<bool> stream_cut{false};
  std::unique_ptr<StreamRecorder> stream_writer;  // guarded by control
  StreamStatus last_stream_status;                // the last stream's, once finished; guarded by control

  mutable std::mutex strings_mutex;
  // Annotation names, each kept once: the index's keys view the deque's
  // strings, which never move. A run that names each step afresh keeps
  // every name (a streamed recording too, until it ends).
  std::deque<std::string> strings{std::string()};
  std::unordered_map<std::string_view, std::uint32_t> string_ids;

  // NVML readings taken at OOMs, each keyed to its OOM event by (thread,
  // ticks); the dump pairs them with the events it keeps. Leaf lock. At most
  // kMaxOomUsage are kept, the newest, as the ring keeps the newest events.
  struct OomUsage {
    std::uint32_t thread = 0;
    std::uint64_t ticks = 0;
    DeviceUsage usage;
  };
  static constexpr std::size_t kMaxOomUsage = 4096;
  std::mutex usage_mutex;
  std::vector<OomUsage> oom_usage;

  std::mutex oom_mutex;
  std::condition_variable oom_cv;
  std::filesystem::path oom_dump_path;  // options.dump_on_oom, guarded by oom_mutex
  bool oom_requested = false;
  bool oom_busy = false;
  std::uint64_t oom_requests = 0;  // OOM dumps asked for, ever
  std::uint64_t oom_dumped = 0;    // of those, answered by a finished dump
  bool quitting = false;
  std::thread oom_worker;
};

}  // namespace cachealloc
