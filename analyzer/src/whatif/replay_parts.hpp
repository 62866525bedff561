// The parts of the what-if replay (replay_allocator, allocator_replay.cpp),
// one concern to a file:
//   replay_settings.cpp  the recorded settings, --set over them, a cap as a fraction
//   replay_device.cpp    the device adaptor that places reservations as recorded
//   replay_observer.cpp  the replaying allocator's totals, and its control for hooks
//   ring_start.cpp       the layout at the ring's start: found, repaired, rebuilt
//   pool_inference.cpp   private pools, inferred from the recorded addresses
//   recorded_pass.cpp    the first pass: the recorded run's figures and requests
//   replayed_pass.cpp    the second pass: the requests through the allocator
// Private to analyzer/src/whatif.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cachealloc/allocator.hpp"
#include "cachealloc/analyzer/allocator_replay.hpp"
#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/replay.hpp"
#include "cachealloc/config.hpp"
#include "cachealloc/device.hpp"

namespace cachealloc::analyzer::whatif {

// --- Settings (replay_settings.cpp) ---

// The recorded value of `key` (Snapshot::settings); "" when the file has none.
std::string recorded_setting(const snapshot::Snapshot& head, const std::string& key);

// The fraction whose cap, as the allocator computes it (fraction x total,
// truncated), is exactly `cap` bytes.
double fraction_for_cap(std::uint64_t cap, std::uint64_t total);

// --- Placement (replay_device.cpp) ---

// Forwards to the simulated device; under Placement::recorded, answers each
// reservation with the recording's address while the replay reserves what the
// recording did, in the same order, and the address is not in use.
class PlacementDevice final : public ForwardingDevice {
 public:
  // `script`: the recorded reservations, (address, bytes), in order.
  PlacementDevice(std::shared_ptr<Device> inner, Placement placement,
                  std::vector<std::pair<std::uint64_t, std::uint64_t>> script);
  void* reserve(std::size_t bytes) override;
  void release(void* ptr, std::size_t bytes) override;

  // Reservations placed as recorded, and whether one could not be.
  std::uint64_t placed() const noexcept { return placed_; }
  bool diverged() const noexcept { return diverged_; }

  // Events recorded on `stream` complete only when complete_event() or
  // synchronize_event() says so: a free that waited completes exactly where
  // the recording completed it, while frees that complete in order share
  // the stream (the allocator walks one queue per stream on every request).
  void hold_events_on(Stream stream);
  // The event last recorded on a held stream.
  DeviceEvent last_held_event(Stream stream) const;
  void complete_event(DeviceEvent event);
  void record_event(DeviceEvent event, Stream stream) override;
  bool query_event(DeviceEvent event) override;
  void synchronize_event(DeviceEvent event) override;
  void destroy_event(DeviceEvent event) noexcept override;

 private:
  bool free_range(std::uint64_t address, std::uint64_t bytes) const;
  std::unordered_map<std::uint64_t, DeviceEvent> held_streams_;  // stream -> its last event
  std::unordered_map<std::uint64_t, bool> held_events_;          // event -> complete

  bool recorded_;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> script_;
  std::size_t next_ = 0;
  bool diverged_ = false;
  std::uint64_t placed_ = 0;
  std::map<std::uint64_t, std::uint64_t> live_;                // address -> bytes
  std::unordered_map<std::uint64_t, std::uint64_t> translate_;  // address -> the inner device's
};

// --- The replaying allocator, observed and controlled (replay_observer.cpp) ---

// The replaying allocator's running totals, from its own events, and the
// fragmentation figures at a moment: what the peak tracking reads. The
// totals follow the layout engine's rules (replay.hpp) for the events the
// allocator emits: a segment or mapping adds its bytes to reserved, a release
// or unmap takes them off; an alloc adds its block to allocated and active,
// free_requested takes it off allocated, free_completed off active. The
// largest free block is asked of the allocator itself, only at the moments
// the figures are read (after each new peak). A second layout engine fed
// every event gave the same figures at ~15% of the whole replay (perf, dev
// VM): two hash lookups per event to keep a layout that is read only there.
class ReplayedTotals final : public AllocatorObserver {
 public:
  // Observes `allocator` from now on (set_observer(nullptr) undoes it).
  void watch(CachingAllocator& allocator) noexcept;
  std::uint32_t on_event(const AllocatorEvent& e) noexcept override;
  // Only allocated, active and reserved are kept.
  const Totals& totals() const noexcept { return totals_; }
  // cached_free and largest_free, as Replay::cache_figures gives them.
  CacheFigures cache_figures(bool with_largest_free) const;

 private:
  Totals totals_;
  const CachingAllocator* allocator_ = nullptr;
};

// What AllocatorReplayOptions::on_annotation may do to the replaying allocator.
class AllocatorControl final : public ReplayControl {
 public:
  explicit AllocatorControl(CachingAllocator& allocator) : allocator_(allocator) {}
  MemoryStats stats() const override;
  void reset_peak_stats() override;

 private:
  CachingAllocator& allocator_;
};

// --- Read by both passes at every event (inline) ---

// Peak tracking with the fragmentation read at the first request boundary
// after each new peak (at the segment_alloc itself the new segment is still
// one free block).
struct PeakTracker {
  std::uint64_t peak_reserved = 0, peak_allocated = 0, peak_event = 0;
  bool pending = false;
  // A trace begun mid-run may peak at its start: its figures are read after
  // the first call, as the recorded pass and summary read them (the call
  // that "reached" it), not before.
  bool skip_next_boundary = false;
  CacheFigures at_peak;
  // Returns true at a new peak of reserved bytes.
  bool after(const Totals& totals, std::uint64_t event) {
    peak_allocated = std::max(peak_allocated, totals.allocated);
    if (totals.reserved <= peak_reserved) return false;
    peak_reserved = totals.reserved;
    peak_event = event;
    pending = true;
    return true;
  }
  // `engine`: a Replay, or ReplayedTotals.
  template <class Figures>
  void boundary(const Figures& engine) {
    if (!pending) return;
    if (skip_next_boundary) {
      skip_next_boundary = false;
      return;
    }
    pending = false;
    at_peak = engine.cache_figures(true);
  }
  void fill(RunFigures& out) const {
    out.peak_reserved = peak_reserved;
    out.peak_allocated = peak_allocated;
    out.peak_reserved_event = peak_event;
    out.cached_free_at_peak = at_peak.cached_free;
    out.largest_free_at_peak = at_peak.largest_free;
    out.fragmentation_at_peak = at_peak.external_fragmentation();
  }
};

// What the program asked of the allocator (the rest is the allocator's reaction).
inline bool is_request(snapshot::EventKind kind) {
  using snapshot::EventKind;
  return kind == EventKind::alloc || kind == EventKind::oom || kind == EventKind::free_requested ||
         kind == EventKind::empty_cache;
}

// The open annotations, outermost first, joined by '/' (OomPoint::annotation).
inline std::string annotation_path(const snapshot::Snapshot& head, const std::vector<std::uint64_t>& open) {
  std::string path;
  for (const std::uint64_t id : open) {
    if (!path.empty()) path += '/';
    path += id < head.strings.size() ? head.strings[id] : "?";
  }
  return path;
}

// Opens or closes the annotation of an annotation_begin or _end event.
inline void annotate(std::vector<std::uint64_t>& open, const snapshot::Event& event) {
  if (event.kind == snapshot::EventKind::annotation_begin) {
    open.push_back(event.aux);
  } else {
    const auto it = std::find(open.rbegin(), open.rend(), event.aux);
    if (it != open.rend()) open.erase(std::next(it).base());
  }
}

// The replay's stream for each recorded one. Those named up front are
// created in the order of their handles, so that streams sort as they did in
// the recording; any other when first named.
class RecordedStreams {
 public:
  RecordedStreams(Device& device, const std::set<std::uint64_t>& handles);
  Stream of(std::uint64_t recorded) {
    if (recorded == 0) return Stream{};
    if (recorded == last_recorded_) return last_stream_;  // requests come in runs on one stream
    auto [it, added] = streams_.try_emplace(recorded);
    if (added) it->second = device_.create_stream();
    last_recorded_ = recorded;
    last_stream_ = it->second;
    return last_stream_;
  }

 private:
  Device& device_;
  std::map<std::uint64_t, Stream> streams_;
  std::uint64_t last_recorded_ = 0;
  Stream last_stream_{};
};

// --- The ring's start (ring_start.cpp) ---

// The layout at the ring's start, as every report takes it (confirmed_start).
InitialLayout initial_layout(EventSource& source, std::int32_t device);



// The blocks of the ring's start the replay goes on with.
struct RebuiltStart {
  std::vector<std::pair<std::uint64_t, void*>> allocated;  // recorded address, the replay's pointer
  std::vector<std::pair<std::uint64_t, Stream>> pending;   // freed, in use on a stream of their own
};

// Lays out `segments` in `allocator`: every segment, then every block in
// address order (each cut from the front of the segment's free remainder),
// all held; then the free and pending ones let go. Throws InvalidArgument
// when the layout does not fit the device.
RebuiltStart rebuild_ring_start(CachingAllocator& allocator, Device& device, RecordedStreams& streams,
                                const std::vector<snapshot::Segment>& segments);

// Segments of `segments` that `allocator` does not hold with the same size,
// pool and blocks (sizes and whether free), in address order.
std::uint64_t segments_not_rebuilt(const CachingAllocator& allocator, const std::vector<snapshot::Segment>& segments);

// --- Private pools (pool_inference.cpp) ---

// Private memory pools (a CUDA graph's capture, torch.cuda.MemPool), which
// no trace entry names: the pool of each request is inferred from where the
// recording put it. PyTorch reserves a segment only when the request's pool
// holds no free block that fits (best fit, same stream, same size class), so
// a segment reserved while a fitting free block of the default pool waited on
// that stream was reserved for another pool: a private one. A capture keeps
// its stream's requests in its pool, so the stream's next reservations are
// that pool's too, until a request on the stream is served from a segment
// outside the pool, or a reservation is made while the pool itself had room
// (the capture has ended). A request belongs to the pool of the segment that
// served it. A pool's use ends (release_pool) where the recording first
// returns one of its segments to the device: at the start of that run of
// releases. Misses what the addresses cannot show: a capture whose first
// reservations each found no fitting default block is taken for the default
// pool until its first reservation that did; with expandable segments the
// default pool maps rather than reserves, and no inference is made.
// Cost: one walk of the segments per reservation, while the trace holds
// one; an ordered lookup per request once a private pool was inferred.
class PoolInference {
 public:
  struct Route {
    std::uint64_t event;  // an alloc (routes) or where a release run starts (releases)
    std::uint32_t pool;   // 1, 2, ...: PrivatePoolId{0, pool}
  };
  std::vector<Route> routes;    // requests served from a private pool, in event order
  std::vector<Route> releases;  // where each pool's use ended, in event order
  std::uint32_t pools = 0;

  explicit PoolInference(const AllocatorConfig& config) : config_(config) {}

  // Called for each event of the device before the engine applies it.
  // Inline: the categories walk calls it for two thirds of the events of a
  // trace, and an alloc outside any private pool's segment (while none was
  // inferred, every alloc) needs no more than this.
  void before(std::size_t i, const snapshot::Event& e, const Replay& engine) {
    using snapshot::EventKind;
    if (e.kind == EventKind::split || e.kind == EventKind::merge) return;
    const EventKind previous = previous_;
    previous_ = e.kind;
    if (config_.expandable_segments) return;
    switch (e.kind) {
      case EventKind::segment_alloc:
        reserved_address_ = e.address;
        reserved_size_ = e.size;
        reserved_before_ = true;
        return;
      case EventKind::segment_release: on_release(i, e, previous); return;
      case EventKind::alloc: {
        // Served from the segment reserved just before it.
        const bool fresh = reserved_before_ && previous == EventKind::segment_alloc && reserved_address_ == e.address;
        reserved_before_ = false;
        if (fresh || !segments_.empty()) on_alloc(i, e, engine, fresh);
        return;
      }
      default: return;
    }
  }

 private:
  void on_release(std::size_t i, const snapshot::Event& e, snapshot::EventKind previous);
  void on_alloc(std::size_t i, const snapshot::Event& e, const Replay& engine, bool fresh);
  std::uint32_t pool_at(std::uint64_t address) const;
  bool fits(const Replay& engine, std::uint64_t stream, std::uint64_t size, std::uint32_t pool) const;

  const AllocatorConfig& config_;
  snapshot::EventKind previous_ = snapshot::EventKind::snapshot;
  bool reserved_before_ = false;
  std::uint64_t reserved_address_ = 0, reserved_size_ = 0;
  std::uint64_t run_start_ = 0;
  std::map<std::uint64_t, std::pair<std::uint64_t, std::uint32_t>> segments_;  // private: address -> (end, pool)
  std::map<std::uint64_t, std::uint32_t> open_;                                // stream -> its capture's pool
  std::set<std::uint32_t> released_;
};

// --- The first pass (recorded_pass.cpp) ---

// What the first pass learns about the recorded run.
struct RecordedPass {
  RunFigures figures;
  std::vector<std::uint64_t> deferred;     // indices of free_requested that waited for streams
  // For each of `deferred`, the queue it waits in: frees that complete in
  // the order they were requested share one (fewest queues, by patience
  // sorting of their completions), so the replaying allocator's walk of its
  // queues on each request stays short however many frees wait.
  std::vector<std::uint32_t> deferred_queue;
  std::vector<std::uint64_t> empty_cache;  // indices before which the program called empty_cache
  std::vector<std::pair<std::uint64_t, std::uint64_t>> reservations;  // (address, size) in order
  std::uint64_t first_oom_cap = 0;  // the recorded cap: an OOM's, else the hint
  std::uint64_t oom_cap = 0;        // an OOM's alone
  std::set<std::uint64_t> streams;  // every stream the requests name
  std::vector<PoolInference::Route> pool_routes, pool_releases;
  std::uint32_t private_pools = 0;
};

// Walks the recorded events of `device` from `initial`, under the recorded
// `config`. `recorded_cap_hint`: the recorded cap when no OOM shows it (0:
// none); `infer_empty_cache`: the trace has no empty_cache entries (PyTorch's).
RecordedPass recorded_pass(EventSource& source, std::int32_t device, const InitialLayout& initial,
                           const AllocatorConfig& config, std::uint64_t recorded_cap_hint, bool infer_empty_cache,
                           std::uint64_t device_total);

// --- The second pass (replayed_pass.cpp) ---

// What the driver settled before the second pass.
struct ReplayPlan {
  std::int32_t device = 0;
  AllocatorConfig config;                 // the replayed settings
  SimulatedDeviceOptions device_options;  // the simulated device
  InitialLayout initial;                  // the ring's start (no segments: the run's start)
  RecordedPass pass;
  double fraction = 0;                    // the replay's memory fraction, 0: no cap
};

// Replays the requests of `source` through the allocator on the simulated
// device, as `plan` says; fills result.replayed, requests,
// initial_blocks_not_rebuilt, placed_as_recorded and placement_diverged.
// Adds the ring start's streams to plan.pass.streams.
void replay_requests(EventSource& source, const AllocatorReplayOptions& options, ReplayPlan& plan,
                     ReplayResult& result);

}  // namespace cachealloc::analyzer::whatif
