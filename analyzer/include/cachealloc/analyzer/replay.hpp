// The replay engine: walks a snapshot's events and maintains the allocator's
// segments and blocks as they were after each event, with running totals.
//
// Every report in analyzer/ is built on one forward walk of this engine, so its
// cost is the cost of the whole tool: O(1) amortized per event, no heap
// allocation per event (block and segment records live in pools that are
// reused), address lookups through a flat hash map, and state proportional to
// the live blocks, never to the number of events.
//
// Semantics of each event kind (model.hpp gives the fields):
//   segment_alloc    a new segment made of one inactive block.
//   alloc            carves [address, address + size) out of the inactive block
//                    that contains it (a split); the block becomes allocated.
//   free_requested   the block becomes pending: no longer allocated, still active.
//   free_completed   the block becomes inactive and merges with inactive
//                    neighbours of the same segment, as the caching allocator does.
//   segment_release  the segment disappears.
//   segment_map      expandable segments: an unmapped range becomes inactive
//                    memory; a range at the end of a segment grows it; a range
//                    outside any segment starts a new expandable segment.
//   segment_unmap    an inactive range becomes unmapped.
//   split, merge     informative; the engine infers both from alloc and free.
// Events that do not fit the state (a free of an unknown block, ...) are
// counted in ReplayAnomalies and otherwise ignored, so a damaged trace still
// gives an answer.
//
// Impossible states: a state no allocator can be in (allocated above active,
// active or inactive_split above reserved, or a total above 2^60 bytes, which
// is what a wrapped subtraction or a corrupted size gives) is no answer at
// all. apply() then throws SnapshotError{inconsistent} naming the event (its
// index counted from the first event this Replay or the one it was copied
// from applied; every caller starts at events[0]) and the totals, and the
// constructor does the same for an initial layout above 2^60 bytes. No report
// prints such figures.
//
// Thread safety: none; one Replay per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cachealloc/analyzer/detail/flat_hash.hpp"
#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::analyzer {

// Running totals, as PyTorch's memory_stats() defines them (the key each
// equals is beside it; tests/test_pytorch_ground_truth.cpp holds them to it).
struct Totals {
  std::uint64_t allocated = 0;  // block sizes of active_allocated blocks       allocated_bytes.all
  std::uint64_t requested = 0;  // requested bytes of active blocks             requested_bytes.all
                                // (PyTorch keeps a pending free's request until it completes)
  std::uint64_t active = 0;     // allocated + pending-free block sizes         active_bytes.all
  std::uint64_t reserved = 0;   // mapped bytes of all segments                 reserved_bytes.all
  // Inactive bytes of split blocks: free blocks in a segment that still holds
  // an active block. PyTorch leaves expandable segments out (their free pages
  // can always be unmapped), and so does this.                    inactive_split_bytes.all
  std::uint64_t inactive_split = 0;
  // Segments from cudaMalloc; PyTorch does not count expandable ones.    segment.all
  std::uint64_t segments = 0;
  friend bool operator==(const Totals&, const Totals&) = default;
};

// How the reserved bytes are spread, at one moment. One name per quantity,
// the same in every report, format and doc (docs/GLOSSARY.md):
//   reserved = allocated + pending_free + cached_free
//   active = allocated + pending_free = requested + rounding_waste
//   cached_free >= inactive_split, cached_free >= releasable
struct CacheFigures {
  std::uint64_t pending_free = 0;    // freed blocks still in use by other streams: active - allocated
  std::uint64_t cached_free = 0;     // free blocks the allocator keeps: reserved - active
  std::uint64_t inactive_split = 0;  // Totals::inactive_split
  // Releasable by empty_cache(): the cached free bytes of segments that hold
  // no active block, plus, in an expandable segment that still holds active
  // blocks, the whole chunks inside its free blocks, which empty_cache()
  // unmaps (2 MiB chunks in the small pool, 20 MiB in the large).
  std::uint64_t releasable = 0;
  std::uint64_t largest_free = 0;    // the largest free block
  std::uint64_t rounding_waste = 0;  // active - requested: rounding inside blocks still held
  // 1 - largest_free / cached_free; 0 when nothing is free.
  double external_fragmentation() const noexcept {
    return cached_free == 0 ? 0.0 : 1.0 - static_cast<double>(largest_free) / static_cast<double>(cached_free);
  }
};

// Events the state could not explain. All zero on a consistent trace.
struct ReplayAnomalies {
  std::uint64_t alloc_outside_free_block = 0;  // no inactive block covered the allocation
  std::uint64_t free_of_unknown_block = 0;     // free of an address holding no active block
  std::uint64_t unknown_segment = 0;           // release/unmap of memory that is not there
  std::uint64_t segment_released_with_active_blocks = 0;
  std::uint64_t total() const noexcept {
    return alloc_outside_free_block + free_of_unknown_block + unknown_segment +
           segment_released_with_active_blocks;
  }
};

// Per-segment figures, for the segments and fragmentation reports.
struct SegmentFigures {
  std::uint64_t address = 0;
  std::uint64_t total_size = 0;
  std::uint64_t reserved = 0;  // mapped bytes
  std::uint64_t allocated = 0;
  std::uint64_t requested = 0;
  std::uint64_t active = 0;
  std::uint64_t inactive = 0;
  std::uint64_t largest_free = 0;
  std::uint32_t blocks = 0;
  std::uint32_t active_blocks = 0;
  bool large_pool = false;
  bool expandable = false;
  std::uint64_t stream = 0;
  std::uint64_t releasable = 0;  // what empty_cache() would give back (CacheFigures::releasable)
  double external_fragmentation() const noexcept {
    return inactive == 0 ? 0.0 : 1.0 - static_cast<double>(largest_free) / static_cast<double>(inactive);
  }
};

// What the engine needs to know about the events before the ring: the
// layout just before events[0], with the counts of its derivation
// (snapshot::RingStart, ring_start.hpp).
using InitialLayout = snapshot::RingStart;

// Derives the layout of `device` before events[0] by walking the events
// backwards from the final layout (snapshot::derive_ring_start, which says
// how). Format version 4 files store the result (Snapshot::ring_start);
// analyze() reads that instead when the events confirm it.
// Cost: O(events + final blocks) time, O(live blocks) memory.
// In a large pool the allocator splits a block only when more than 1 MiB
// would remain, and free neighbours merge: a free block of at most 1 MiB
// there is the unsplit tail of the block before it, whose size a PyTorch
// trace gives only as its request (a derivation then sees a gap). Joins each
// such fragment to that block; returns how many. derive_initial_layout does
// this (InitialLayout::joined_fragments).
std::uint64_t join_impossible_fragments(std::vector<snapshot::Segment>& segments);

InitialLayout derive_initial_layout(const snapshot::Snapshot& snapshot, std::int32_t device);
// The same over a source, reading its blocks from the last to the first.
class EventSource;
InitialLayout derive_initial_layout(EventSource& source, std::int32_t device);

class Replay {
  static constexpr std::uint32_t kNone = 0xffffffffu;
  // The largest tail a large-pool block keeps unsplit (PyTorch's kSmallSize).
  static constexpr std::uint64_t kUnsplitTail = std::uint64_t{1} << 20;

 public:
  // Starts from `initial` (see derive_initial_layout) for events of `device`.
  // `stack_count` sizes the per-stack live counters (snapshot.stacks.size()).
  // `inferred_sizes`: the trace's block sizes may be only inferred from
  // requests (a PyTorch pickle, whose trace records no block size, in a
  // segment made before its first event): an alloc that would leave a
  // large-pool tail of 1 MiB or less takes the whole free block, as the
  // allocator does (sized_by_policy). Off for our own files, whose sizes are
  // the allocator's.
  Replay(const std::vector<snapshot::Segment>& initial, std::int32_t device, std::size_t stack_count,
         bool inferred_sizes = false);
  // Whether `head`'s block sizes for `device` may be inferred (see the
  // constructor): each device's trace of a PyTorch pickle is sized alone.
  static bool sizes_may_be_inferred(const snapshot::Snapshot& head, std::int32_t device) noexcept;
  ~Replay();
  // A copy is explicit: it costs O(live blocks + segments + stacks), which
  // is what keeping the state at one moment while replaying on needs.
  explicit Replay(const Replay&) = default;
  Replay& operator=(const Replay&) = delete;

  // Applies one event. Events of another device change nothing, except
  // annotations, which belong to the whole program.
  void apply(const snapshot::Event& event);
  // The same, defined inline in analyzer/src/core/replay_hot.hpp so the analyzer's
  // own loops avoid a call per event. Callable only from analyzer/src.
  inline void apply_inline(const snapshot::Event& event);

  // For a Replay that starts inside a trace (the parallel analysis): the
  // index of the next event it applies (error messages count from it) and
  // the annotations open there, outermost first.
  void resume_at(std::uint64_t next_event, std::vector<snapshot::StringId> open_annotations) {
    applied_ = next_event;
    annotations_ = std::move(open_annotations);
  }

  std::int32_t device() const noexcept { return device_; }
  const Totals& totals() const noexcept { return totals_; }
  const ReplayAnomalies& anomalies() const noexcept { return anomalies_; }
  // segment_alloc events whose range overlapped a live segment: a damaged
  // trace, which the replay still follows (not an anomaly), but where which
  // segment an alloc lands in depends on the order segments were made; the
  // parallel analysis gives way to the serial one when it sees one.
  std::uint64_t overlapping_segments() const noexcept { return overlapping_segments_; }

  // The fragmentation figures now. O(1) without the largest free block
  // (left 0); with it, O(segments) plus a walk of the blocks of each segment
  // whose free blocks changed since the last call.
  CacheFigures cache_figures(bool with_largest_free = true) const;
  std::vector<SegmentFigures> segment_figures() const;  // in address order

  // The layout now, in the model's terms, segments in address order.
  // O(live blocks); meant for reports, not per event.
  std::vector<snapshot::Segment> layout() const;

  // Live (allocated, not pending) bytes and blocks per StackId, indexed by
  // StackId::value. Updated on every alloc and free.
  const std::vector<std::uint64_t>& live_bytes_by_stack() const noexcept { return live_bytes_by_stack_; }
  const std::vector<std::uint32_t>& live_blocks_by_stack() const noexcept { return live_blocks_by_stack_; }
  // The stack whose live bytes the last event changed, if it changed any.
  std::optional<snapshot::StackId> last_touched_stack() const noexcept {
    if (last_touched_stack_ == kNone) return std::nullopt;
    return snapshot::StackId{last_touched_stack_};
  }

  // Calls visit(const LiveBlock&) for every allocated block (not pending), in no order.
  struct LiveBlock {
    std::uint64_t address;
    std::uint64_t size;
    std::uint64_t requested;
    snapshot::StackId stack;
  };
  template <class Visit>
  void for_each_allocated(Visit&& visit) const {
    for (const BlockNode& block : blocks_) {
      if (block.live && block.state == snapshot::BlockState::active_allocated)
        visit(LiveBlock{block.address, block.size, block.requested, block.stack});
    }
  }

  // The allocated block (not pending) that starts at `address`, if any.
  // O(1). Defined in analyzer/src/core/replay_hot.hpp: callable only from
  // analyzer/src.
  inline std::optional<LiveBlock> allocated_at(std::uint64_t address) const;

  // Open annotations, outermost first.
  const std::vector<snapshot::StringId>& open_annotations() const noexcept { return annotations_; }

 private:

  struct BlockNode {
    std::uint64_t address = 0;
    std::uint64_t size = 0;
    std::uint64_t requested = 0;
    std::uint32_t prev = kNone;  // neighbours in the same segment
    std::uint32_t next = kNone;
    std::uint32_t segment = kNone;
    snapshot::StackId stack{};
    snapshot::BlockState state = snapshot::BlockState::inactive;
    bool live = false;  // false while the record sits on the free list
  };
  struct SegmentNode {
    std::uint64_t address = 0;
    std::uint64_t total_size = 0;
    std::uint64_t stream = 0;
    std::uint64_t mapped = 0;
    std::uint64_t allocated = 0;
    std::uint64_t requested = 0;
    std::uint64_t active = 0;
    std::uint64_t inactive = 0;
    std::uint32_t first_block = kNone;
    std::uint32_t block_count = 0;
    std::uint32_t active_blocks = 0;
    snapshot::StackId stack{};
    bool large_pool = false;
    bool expandable = false;
    bool live = false;
    mutable bool largest_free_stale = true;
    mutable std::uint64_t largest_free = 0;
    // Whole free chunks of an expandable segment (releasable_of), like largest_free.
    mutable bool free_chunks_stale = true;
    mutable std::uint64_t free_chunks = 0;
  };

  void on_alloc(const snapshot::Event& event);
  void on_free_requested(std::uint64_t address);
  void on_free_completed(std::uint64_t address);
  void on_segment_alloc(std::uint64_t address, std::uint64_t size, std::uint64_t stream, bool large_pool,
                        bool expandable, snapshot::StackId stack);
  void on_segment_release(std::uint64_t address);
  void on_segment_map(const snapshot::Event& event);
  void on_segment_unmap(std::uint64_t address, std::uint64_t size);
  void on_annotation_end(snapshot::StringId name);

  std::uint32_t new_block();
  void drop_block(std::uint32_t id);
  std::uint32_t new_segment();
  // The segment whose address range holds `address`, kNone if none. O(segments).
  std::uint32_t segment_containing(std::uint64_t address) const;
  mutable std::uint32_t last_segment_ = kNone;  // segment_containing()'s last answer
  // Splits blocks so that [address, address + size) is one block of state
  // `expected`; returns it, or kNone when no such block covers the range.
  std::uint32_t isolate(std::uint32_t segment, std::uint64_t address, std::uint64_t size,
                        snapshot::BlockState expected);
  // Splits `id` at `at` (inside it); the tail keeps the state. Returns the tail.
  std::uint32_t split_block(std::uint32_t id, std::uint64_t at);
  // Merges `id` with neighbours in the same state; returns the surviving block.
  std::uint32_t coalesce(std::uint32_t id);
  // cached_unsplit_ counts the inactive bytes of segments without active
  // blocks; bracket every change of a segment's counters with these two.
  void segment_leave(const SegmentNode& segment) noexcept;
  void segment_enter(const SegmentNode& segment) noexcept;
  std::uint64_t largest_free_of(const SegmentNode& segment) const;
  // What empty_cache() would give back from the segment: CacheFigures::releasable.
  std::uint64_t releasable_of(const SegmentNode& segment) const;
  void add_live(snapshot::StackId stack, std::uint64_t bytes);
  void remove_live(snapshot::StackId stack, std::uint64_t bytes);
  void load(const std::vector<snapshot::Segment>& initial);

  std::int32_t device_;
  bool inferred_sizes_ = false;
  Totals totals_;
  ReplayAnomalies anomalies_;
  std::uint64_t overlapping_segments_ = 0;
  std::uint64_t cached_unsplit_ = 0;
  bool any_expandable_ = false;  // an expandable segment was ever live: cache_figures looks for free chunks
  std::vector<BlockNode> blocks_;
  std::vector<std::uint32_t> free_blocks_;
  std::vector<SegmentNode> segments_;
  std::vector<std::uint32_t> free_segments_;
  detail::FlatHashMap block_at_;    // block start address -> block id
  detail::FlatHashMap segment_at_;  // segment start address -> segment id
  // free_completed usually follows its free_requested at once: skip the lookup.
  std::uint64_t pending_address_ = 0;
  std::uint32_t pending_id_ = kNone;
  std::vector<std::uint64_t> live_bytes_by_stack_;
  std::vector<std::uint32_t> live_blocks_by_stack_;
  std::uint32_t last_touched_stack_ = kNone;
  std::uint64_t applied_ = 0;  // events applied: the index of the next one

  // A total above this is no device's: 1 EiB.
  static constexpr std::uint64_t kImpossibleBytes = std::uint64_t{1} << 60;
  static bool impossible(const Totals& t) noexcept {
    return (t.allocated > t.active) | (t.active > t.reserved) | (t.inactive_split > t.reserved) |
           (t.reserved > kImpossibleBytes) | (t.requested > kImpossibleBytes);
  }
  [[noreturn, gnu::cold]] void refuse_impossible_state(bool initial = false) const;
  std::vector<snapshot::StringId> annotations_;
};

}  // namespace cachealloc::analyzer
