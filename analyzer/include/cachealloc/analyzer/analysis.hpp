// One pass over a snapshot that computes everything summary, peak, top,
// fragmentation, timeline and oom need: counts, peaks with their moment,
// per-site figures (including each site's share of the peak), fragmentation
// samples, OOM post-mortems and a check of the replayed final layout.
//
// Cost: one forward Replay, O(1) amortized per event, reading the events
// block by block from an EventSource (event_source.hpp). Per-site bytes at the
// peak are kept with a "touched since the last peak" list, so a new peak costs
// only the sites that changed since the previous one, never a copy of the
// live set. Memory: O(live blocks + stacks + timeline rows asked for).
//
// Thread safety: analyze() is reentrant.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/replay.hpp"
#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::analyzer {

inline constexpr std::size_t kNoEvent = std::numeric_limits<std::size_t>::max();

// Half-open range of indices into Snapshot::events.
class Categorization;  // categories.hpp

struct EventWindow {
  std::size_t begin = 0;
  std::size_t end = kNoEvent;  // clamped to events.size()
};

// Parses a point in the trace: "123" is event 123; "1.5s", "250ms", "10us",
// "5ns" is a time measured from events[0]. Returns the index of the first
// event at or after that point (events.size() when past the end), or nullopt
// with `error` set.
std::optional<std::size_t> parse_event_point(const snapshot::Snapshot& snapshot, std::string_view text,
                                             std::string& error);
// The same over a source; a time costs a forward read up to its block.
std::optional<std::size_t> parse_event_point(EventSource& source, std::string_view text, std::string& error);
// Where a state or a window that ends at `text` ends: the number of events
// in it. "123" takes events 0 to 123 (124 of them); a time takes every event
// at or before it, so "1.5s" between events 7 (at 0.02 s) and 8 (at 5.5 s)
// takes events 0 to 7. events.size() when past the end; nullopt with
// `error` set when `text` is neither. An end between a free_requested and
// the free_completed right after it (a free that waited for no stream: one
// call in PyTorch, no state between) moves after the free_completed.
std::optional<std::size_t> parse_state_end(EventSource& source, std::string_view text, std::string& error);

// Picks the device to analyze: `requested` when >= 0, else the first device
// the snapshot describes, else the first device that has events or segments.
std::int32_t pick_device(const snapshot::Snapshot& snapshot, std::int32_t requested);
std::int32_t pick_device(EventSource& source, std::int32_t requested);

struct AnalysisOptions {
  std::int32_t device = -1;
  EventWindow window;
  // In a trace begun mid-run, a window that starts before the ring's first
  // memory event (Analysis::ring_begins_at) starts there, and one that ends
  // before it throws InvalidArgument: no memory was recorded there. False
  // keeps the window as asked (a listing of the events themselves).
  bool window_from_ring = true;
  // Timeline rows: none, one per event, or `buckets` equal slices of the window.
  enum class Timeline { none, per_event, buckets } timeline = Timeline::none;
  std::size_t buckets = 0;
  // Sample CacheFigures (largest free block...) at each bucket end; O(segments) each.
  bool sample_fragmentation = false;
  // How many sites to keep per OOM.
  std::size_t oom_sites = 5;
  // Called after every block of events with (events done, events total).
  std::function<void(std::size_t, std::size_t)> progress;
  // Called once with the state after the window's last event, for reports
  // that need the full layout or live set at the end in the same pass. When
  // analyze() tries a start it must then confirm, the call waits for that
  // (on a copy of the state) and is never made for a start that failed.
  std::function<void(const Replay&)> at_end;
  // Threads for the events of a window that covers the whole trace (0: one
  // per core the process may run on, from 6 cores up, else one; below 6 the
  // one-thread pass with FileEvents decoding ahead is faster). With more
  // than one, the trace is cut into that many ranges of
  // blocks: one scan per range finds what it leaves behind (the blocks and
  // segments it adds, changes and removes, the annotations it opens and
  // closes), the state at each range's start follows from those, and each
  // range is then replayed on its own thread, the figures merged in event
  // order. The answer is the serial one, event for event; a trace the
  // parallel pass does not cover (expandable segments, events the state
  // cannot explain, a layout whose free blocks are not merged, a timeline of
  // one row per event, a window that is not the whole trace, a source
  // without open_another()) is analysed on the calling thread alone.
  // Memory: one Replay and one set of per-site counters per thread.
  unsigned threads = 1;
  // Also categorize the device's allocations (categorize()) in the same
  // pass, where it is one pass over the whole trace on one thread: then
  // Analysis::categories holds them, with the categories at the allocated
  // peak, at the end and at each timeline row's allocated maximum summed,
  // and a report reads the events once instead of twice. Memory: the walk's
  // (categories.hpp).
  bool categories = false;
  // With categories: also keep each allocation's category change, so that
  // figures at moments the walk did not sum (Categorization::at of another
  // event, allocations(), peaks()) need no replay of the events. A report
  // that asks only for the summed moments (summary) turns it off: on a long
  // trace the changes are most of the walk's memory and a tenth of its time.
  bool category_changes = true;
  // Also keep the allocations live at the allocated or the reserved peak
  // (Analysis::live_at_peak), so that a report that lists them (peak) reads
  // the events once instead of replaying them to the peak again. Costs a
  // hash probe per alloc and free; memory: that live set and the addresses
  // touched after the last new maximum.
  enum class LiveAtPeak { none, allocated, reserved } live_at_peak = LiveAtPeak::none;
};

// Where a figure reached its maximum.
struct Peak {
  std::uint64_t bytes = 0;
  std::size_t event = kNoEvent;  // the event after which it held; kNoEvent: at the window's start
  std::uint64_t time_ns = 0;
  std::vector<snapshot::StringId> phase;  // open annotations, outermost first
};

struct SiteFigures {
  snapshot::StackId stack{};
  std::uint64_t allocs = 0;        // alloc events in the window
  std::uint64_t alloc_bytes = 0;   // their block sizes
  std::uint64_t requested_bytes = 0;
  std::uint64_t bytes_at_peak_allocated = 0;
  std::uint32_t blocks_at_peak_allocated = 0;
  std::uint64_t bytes_at_peak_reserved = 0;
  std::uint32_t blocks_at_peak_reserved = 0;
  std::uint64_t live_bytes_at_end = 0;
  std::uint32_t live_blocks_at_end = 0;
};

struct SiteBytes {
  snapshot::StackId stack{};
  std::uint64_t bytes = 0;
  std::uint32_t blocks = 0;
};

struct OomRecord {
  std::size_t event = 0;
  std::uint64_t time_ns = 0;
  std::vector<snapshot::StringId> phase;
  std::uint64_t requested = 0;
  std::uint64_t device_free = 0;
  std::uint64_t cap = 0;  // 0: no cap
  Totals totals;
  CacheFigures cache;
  std::vector<SiteBytes> top_sites;  // by live bytes, largest first
};

struct TimelineRow {
  std::size_t first_event = kNoEvent;  // kNoEvent: the state at the window's start
  std::size_t last_event = kNoEvent;
  std::uint64_t time_ns = 0;          // of last_event
  snapshot::EventKind kind = snapshot::EventKind::alloc;  // of last_event, per-event rows only
  Totals at_end;                      // after last_event
  Totals max;                         // the largest value of each figure inside the row
  std::optional<CacheFigures> cache;  // at the row's end, when sampled
};

// The result of comparing the replayed layout with the one stored at dump.
struct LayoutCheck {
  bool checked = false;  // false when the window ends before the last event
  std::size_t differences = 0;
  std::vector<std::string> first_differences;  // a few, for the report
};

struct Analysis {
  std::int32_t device = 0;
  std::size_t event_count = 0;      // in the whole trace
  EventWindow window;               // resolved
  std::uint64_t time_origin_ns = 0; // events[0].time_ns; report times are relative to it
  std::uint64_t dropped_events = 0;
  std::array<std::uint64_t, snapshot::kEventKindCount> counts{};  // in the window, this device
  std::uint64_t blocks_from_before_ring = 0;  // see InitialLayout
  std::uint64_t unplaced_blocks = 0;
  Totals totals_at_start;
  Totals totals_at_end;
  CacheFigures cache_at_start;
  CacheFigures cache_at_end;
  // At the peak of reserved bytes, after the call that reached it; largest_free included.
  CacheFigures cache_at_peak_reserved;
  // Segments from cudaMalloc, as PyTorch's segment.all.current counts them.
  std::size_t segments_at_end = 0;
  // Expandable segments: one reserved address range each, which PyTorch's
  // snapshot lists once per mapped piece and its segment stat leaves out.
  std::size_t expandable_segments_at_end = 0;
  Peak peak_allocated, peak_reserved, peak_active, peak_requested, peak_inactive_split;
  std::uint64_t peak_segments = 0;  // Totals::segments
  std::vector<SiteFigures> sites;  // indexed by StackId::value; unused stacks have zero figures
  std::vector<OomRecord> ooms;
  std::vector<TimelineRow> timeline;
  ReplayAnomalies anomalies;
  LayoutCheck layout_check;
  // Threads the events were analysed on: AnalysisOptions::threads where the
  // parallel pass covered the trace, else 1.
  unsigned threads = 1;
  // The state before events[0] the events confirmed, confirmed_start()'s
  // answer: a later walk of the same trace (categorize()) starts from it
  // instead of replaying every event again to find it.
  std::shared_ptr<const InitialLayout> start;
  // AnalysisOptions::categories, where the pass could take them; null
  // otherwise (a window, several threads): categorize() then.
  std::shared_ptr<const Categorization> categories;
  // AnalysisOptions::live_at_peak: the allocated blocks after the peak's
  // event (at the window's start for a peak at kNoEvent), in no order, where
  // the one-thread pass kept them from a trace without ReplayAnomalies;
  // absent otherwise (several threads, a damaged trace): replay_to() then.
  std::optional<std::vector<Replay::LiveBlock>> live_at_peak;

  // The allocator already held memory when the ring began (the history was
  // switched on mid-run, or a PyTorch ring overflowed without saying so).
  bool starts_mid_run = false;
  // In a trace begun mid-run, its first event of the device that is not an
  // annotation (first_memory_event), where it has events before that one; 0
  // otherwise. Those earlier events are annotations older than every memory
  // event: PyTorch keeps annotations in a ring of their own, which reaches
  // further back. The memory of their time was not recorded, so the window
  // starts here: window_cut_to_ring when it asked for earlier events.
  std::size_t ring_begins_at = 0;
  std::uint64_t ring_begins_time_ns = 0;  // that event's time
  bool window_cut_to_ring = false;

  // Allocations whose block size the reader could only infer (at least the
  // rounded request): a PyTorch trace that begins mid-run, or a file that is
  // not what PyTorch's policy would have written (settings
  // "block_sizes.inferred" + "block_sizes.contradicted",
  // snapshot/src/pickle/pickle_block_sizes.hpp).
  std::uint64_t inferred_block_sizes = 0;
  // A PyTorch snapshot without allocator_settings (older PyTorch): block
  // sizes follow PyTorch's default policy, which the run may not have used.
  bool block_policy_assumed = false;

  // True when events before the ring were lost, the ring began mid-run, or
  // block sizes were inferred: counts and peaks are then lower bounds for the
  // whole run.
  bool truncated() const noexcept {
    return dropped_events > 0 || starts_mid_run || inferred_block_sizes > 0 || block_policy_assumed;
  }

  // Device memory calls in the window, as PyTorch counts them: cudaMalloc
  // and cudaFree of segments, and the map and unmap calls of expandable
  // segments (num_device_alloc, num_device_free over the whole run when the
  // window is the whole trace and the trace covers the whole run).
  std::uint64_t device_allocs() const noexcept {
    return counts[static_cast<std::size_t>(snapshot::EventKind::segment_alloc)] +
           counts[static_cast<std::size_t>(snapshot::EventKind::segment_map)];
  }
  std::uint64_t device_frees() const noexcept {
    return counts[static_cast<std::size_t>(snapshot::EventKind::segment_release)] +
           counts[static_cast<std::size_t>(snapshot::EventKind::segment_unmap)];
  }
};

Analysis analyze(const snapshot::Snapshot& snapshot, const AnalysisOptions& options);
// The same, reading the events block by block: memory is the replayed state
// (live blocks, segments, per-stack counters), the head's tables and one
// block of events, whatever the number of events.
// The state before events[0] is, in order of cost: the ring start the file
// stores (format version 4, Snapshot::ring_start), or for a ring that never
// overflowed the empty allocator; either holds only when the events confirm
// it (no ReplayAnomalies, and the replayed final layout equals the stored
// one; a window that ends early then costs a replay of the rest of the
// events). Otherwise the start is derived (derive_initial_layout): one
// backward pass and a second forward pass, each one block at a time. A
// stored start consistent with the events is trusted for what they cannot
// confirm: blocks_from_before_ring, unplaced_blocks, and the stacks and
// requested bytes of blocks alive at the start.
Analysis analyze(EventSource& source, const AnalysisOptions& options);

// The index of the first event of `device` that is not an annotation
// (event_count() when there is none): where a trace begun mid-run starts to
// record memory. Reads blocks from the first until it finds one; `time_ns`,
// when given, gets that event's time.
std::size_t first_memory_event(EventSource& source, std::int32_t device, std::uint64_t* time_ns = nullptr);

// Replays to just after event `index` (kNoEvent: the state before events[0]) and
// hands the Replay to `inspect`. For reports that need the full state at one
// moment (segments --at, leaks, peak listings). O(index) time, from a derived
// start; from a start the file stores or the empty start of a ring that never
// overflowed, O(events) instead, since such a start holds only once the
// events to the end confirm it, as for analyze()
// (the state at `index` is copied, O(live blocks), while the replay goes on).
void replay_to(const snapshot::Snapshot& snapshot, std::int32_t device, std::size_t index,
               const std::function<void(const Replay&)>& inspect,
               const std::function<void(std::size_t, std::size_t)>& progress = {});
void replay_to(EventSource& source, std::int32_t device, std::size_t index,
               const std::function<void(const Replay&)>& inspect,
               const std::function<void(std::size_t, std::size_t)>& progress = {});

// The state before events[0] that replay_to() and analyze() start from: the
// ring start the file stores, else for a ring that never overflowed the
// empty allocator, each only when the events replayed from it explain the
// trace; otherwise the derived one (derive_initial_layout). One replay of
// every event, plus a backward pass when the guess fails.
InitialLayout confirmed_start(EventSource& source, std::int32_t device);

// Compares two layouts; stacks of inactive blocks and segment stacks are
// ignored because the recorder need not keep them. Returns one line per
// difference, at most `limit` lines, and the total count in `count`.
std::vector<std::string> compare_layouts(const std::vector<snapshot::Segment>& replayed,
                                         const std::vector<snapshot::Segment>& stored, std::size_t limit,
                                         std::size_t& count);

}  // namespace cachealloc::analyzer
