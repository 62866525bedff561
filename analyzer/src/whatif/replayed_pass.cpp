// The second pass: the recorded requests through the real allocator on the
// simulated device, from the ring's start, with what the first pass inferred
// (waiting frees, empty_cache calls, private pools) done where it happened.
#include <cmath>
#include <string_view>

#include "cachealloc/analyzer/detail/flat_hash.hpp"
#include "cachealloc/errors.hpp"
#include "whatif/replay_parts.hpp"

namespace cachealloc::analyzer::whatif {

using snapshot::Event;
using snapshot::EventKind;

RecordedStreams::RecordedStreams(Device& device, const std::set<std::uint64_t>& handles) : device_(device) {
  for (const std::uint64_t handle : handles)
    if (handle != 0) streams_[handle] = device_.create_stream();
}

namespace {

// Where the replay keeps the program's live pointers: recorded address ->
// pointer, through a flat map into a slot pool (no heap allocation per event).
class LivePointers {
 public:
  void put(std::uint64_t address, void* ptr) {
    std::uint32_t slot = map_.find(address);
    if (slot == detail::FlatHashMap::kMissing) {
      if (free_.empty()) {
        slot = static_cast<std::uint32_t>(slots_.size());
        slots_.push_back(ptr);
      } else {
        slot = free_.back();
        free_.pop_back();
        slots_[slot] = ptr;
      }
      map_.insert(address, slot);
    } else {
      slots_[slot] = ptr;
    }
  }
  void* take(std::uint64_t address) {
    const std::uint32_t slot = map_.find(address);
    if (slot == detail::FlatHashMap::kMissing) return nullptr;
    map_.erase(address);
    free_.push_back(slot);
    return slots_[slot];
  }

 private:
  detail::FlatHashMap map_;
  std::vector<void*> slots_;
  std::vector<std::uint32_t> free_;
};

// A request of an inferred private pool: the allocator routes it there for
// this one call, as PyTorch's capture does for each request on its stream.
// The first request creates the pool (use count 1); the use ends at the
// recorded release.
void* allocate_in_pool(CachingAllocator& allocator, PrivatePoolId pool, std::size_t bytes, Stream stream) {
  const bool known = allocator.pool_use_count(pool) > 0;
  allocator.begin_allocate_to_pool(pool, [](Stream) { return true; });
  struct End {
    CachingAllocator& allocator;
    PrivatePoolId pool;
    bool known;
    ~End() {
      allocator.end_allocate_to_pool(pool);
      if (known) allocator.release_pool(pool);
    }
  } end{allocator, pool, known};
  return allocator.allocate(bytes, stream);
}

// The reservations PlacementDevice places as recorded: the ring start's
// segments, then the run's.
std::vector<std::pair<std::uint64_t, std::uint64_t>> reservation_script(const ReplayPlan& plan) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> script;
  for (const auto& segment : plan.initial.segments) script.emplace_back(segment.address, segment.total_size);
  script.insert(script.end(), plan.pass.reservations.begin(), plan.pass.reservations.end());
  return script;
}

// One replay: the allocator on `placement`, fed each recorded request.
// Members are destroyed allocator first: the totals it reports to outlive it.
class RequestReplay {
 public:
  RequestReplay(EventSource& source, const AllocatorReplayOptions& options, const ReplayPlan& plan,
                PlacementDevice& placement, std::shared_ptr<Device> device, ReplayResult& result)
      : source_(source),
        head_(source.head()),
        options_(options),
        plan_(plan),
        placement_(placement),
        result_(result),
        streams_(placement, plan.pass.streams),
        allocator_(std::move(device), plan.config),
        control_(allocator_) {
    engine_.watch(allocator_);
  }

  // The ring's start laid out, then the replay's cap.
  void start() {
    const RebuiltStart start = rebuild_ring_start(allocator_, placement_, streams_, plan_.initial.segments);
    for (const auto& [address, ptr] : start.allocated) live_.put(address, ptr);
    for (const auto& [address, side] : start.pending) deferred_streams_[address] = side;
    if (result_.starts_mid_run) {
      result_.initial_blocks_not_rebuilt = segments_not_rebuilt(allocator_, plan_.initial.segments);
      allocator_.reset_peak_stats();
    }
    // The window's own device calls, as the recorded column counts them.
    const MemoryStats rebuilt = allocator_.stats();
    start_device_allocs_ = static_cast<std::uint64_t>(rebuilt.num_device_alloc);
    start_device_frees_ = static_cast<std::uint64_t>(rebuilt.num_device_free);
    if (plan_.fraction != 0) allocator_.set_memory_fraction(plan_.fraction);
    // The start is rebuilt as recorded, whatever the cap: one that it
    // exceeds could not have held it, and the run ran out of memory before
    // the trace begins.
    const auto start_reserved = static_cast<std::uint64_t>(rebuilt.reserved_bytes[stat_all].current);
    if (result_.starts_mid_run && result_.cap != 0 && start_reserved > result_.cap) {
      result_.replayed.first_oom = OomPoint{0, start_reserved, std::string(), true};
      result_.notes.push_back("the layout at the ring's start already reserves " + std::to_string(start_reserved) +
                              " bytes, above the replay's cap of " + std::to_string(result_.cap) +
                              " bytes: under that cap the run runs out of memory before its first recorded event, "
                              "whatever the settings (the replay goes on from the start as recorded)");
    }
    peaks_.skip_next_boundary = peaks_.after(engine_.totals(), kNoEvent);
  }

  void run() {
    for_each_event(source_, 0, source_.event_count(), [this](std::size_t i, const Event& e) {
      on_event(i, e);
      return true;
    });
  }

  // The replayed run's figures. The allocator's destructor then returns
  // everything to the device; the program's live blocks are dropped with it.
  void finish() {
    peaks_.skip_next_boundary = false;  // a trace with no request: the start's figures
    peaks_.boundary(engine_);
    peaks_.fill(result_.replayed);
    const MemoryStats stats = allocator_.stats();
    result_.replayed.segments = static_cast<std::uint64_t>(stats.segment[stat_all].current);
    result_.replayed.device_allocs = static_cast<std::uint64_t>(stats.num_device_alloc) - start_device_allocs_;
    result_.replayed.device_frees = static_cast<std::uint64_t>(stats.num_device_free) - start_device_frees_;
    result_.replayed.retries = static_cast<std::uint64_t>(stats.num_alloc_retries);
    result_.replayed.ooms = static_cast<std::uint64_t>(stats.num_ooms) +
                            (result_.replayed.first_oom && result_.replayed.first_oom->at_start ? 1 : 0);
    result_.replayed.reserved_at_end = static_cast<std::uint64_t>(stats.reserved_bytes[stat_all].current);
    result_.replayed.allocated_at_end = static_cast<std::uint64_t>(stats.allocated_bytes[stat_all].current);
    allocator_.set_observer(nullptr);
  }

 private:
  void on_event(std::size_t i, const Event& e) {
    if (e.kind == EventKind::annotation_begin || e.kind == EventKind::annotation_end) return on_annotation(e);
    if (e.device != plan_.device) return;
    before_event(i);
    switch (e.kind) {
      case EventKind::alloc:
      case EventKind::oom:
        request(i, e);
        peaks_.after(engine_.totals(), peak_name(i));
        recorded_reservation_ = kNoEvent;
        return;
      case EventKind::free_requested: free_requested(i, e); break;
      case EventKind::free_completed: free_completed(e); break;
      case EventKind::empty_cache:
        peaks_.boundary(engine_);
        allocator_.empty_cache();
        break;
      case EventKind::segment_alloc:
      case EventKind::segment_map: recorded_reservation_ = i; break;
      default: break;
    }
    if (is_request(e.kind)) recorded_reservation_ = kNoEvent;
    peaks_.after(engine_.totals(), i);
  }

  // The event that names a peak the replay reached serving request `i`: the
  // recording logs the reservation as its own event just before the request
  // (the last of them, where it made several), and the recorded column names
  // that one, as summary does; where the recording reserved nothing for the
  // request (other settings, a cap), the request itself.
  std::uint64_t peak_name(std::size_t i) {
    const bool reserved_as_recorded = recorded_reservation_ != kNoEvent;
    if (engine_.totals().reserved > peaks_.peak_reserved)
      result_.replayed_peak_at_request = !reserved_as_recorded;
    return reserved_as_recorded ? recorded_reservation_ : i;
  }

  void on_annotation(const Event& e) {
    annotate(open_, e);
    if (!options_.on_annotation) return;
    const std::string_view name =
        e.aux < head_.strings.size() ? std::string_view(head_.strings[e.aux]) : std::string_view();
    options_.on_annotation(e, name, control_);
  }

  // What the first pass inferred before event `i`: private pools whose use
  // ended, and the program's empty_cache.
  void before_event(std::size_t i) {
    const auto& releases = plan_.pass.pool_releases;
    for (; next_release_ < releases.size() && releases[next_release_].event == i; ++next_release_) {
      const PrivatePoolId pool{0, releases[next_release_].pool};
      if (allocator_.pool_use_count(pool) > 0) allocator_.release_pool(pool);
    }
    const auto& empties = plan_.pass.empty_cache;
    if (next_empty_ < empties.size() && empties[next_empty_] == i) {
      ++next_empty_;
      peaks_.boundary(engine_);
      allocator_.empty_cache();
    }
  }

  // An alloc, or a request that failed in the recording (held here if it succeeds).
  void request(std::size_t i, const Event& e) {
    peaks_.boundary(engine_);
    ++result_.requests;
    std::uint64_t bytes = e.kind == EventKind::oom ? e.size : (e.aux != 0 ? e.aux : e.size);
    if (options_.scale != 1.0)
      bytes = std::max<std::uint64_t>(
          1, static_cast<std::uint64_t>(std::llround(static_cast<double>(bytes) * options_.scale)));
    const auto& routes = plan_.pass.pool_routes;
    const bool to_pool = next_route_ < routes.size() && routes[next_route_].event == i;
    const PrivatePoolId pool{0, to_pool ? routes[next_route_++].pool : 0};
    try {
      void* ptr = to_pool ? allocate_in_pool(allocator_, pool, bytes, streams_.of(e.stream))
                          : allocator_.allocate(bytes, streams_.of(e.stream));
      if (e.kind == EventKind::alloc) live_.put(e.address, ptr);
      else held_.push_back(ptr);
    } catch (const OutOfMemoryError&) {
      if (!result_.replayed.first_oom) result_.replayed.first_oom = OomPoint{i, bytes, annotation_path(head_, open_)};
    }
  }

  void free_requested(std::size_t i, const Event& e) {
    peaks_.boundary(engine_);
    const auto& deferred = plan_.pass.deferred;
    const bool waits = next_deferred_ < deferred.size() && deferred[next_deferred_] == i;
    if (waits) ++next_deferred_;
    void* ptr = live_.take(e.address);
    if (ptr == nullptr) return;  // its alloc failed here, or it predates a damaged start
    if (!waits) {
      allocator_.deallocate(ptr);
      return;
    }
    const Stream queue = queue_stream(plan_.pass.deferred_queue[next_deferred_ - 1]);
    allocator_.record_stream(ptr, queue);
    allocator_.deallocate(ptr);
    deferred_events_[e.address] = placement_.last_held_event(queue);
  }

  // The stream of a queue of waiting frees (PlanPass::deferred_queue).
  Stream queue_stream(std::uint32_t queue) {
    while (queue_streams_.size() <= queue) {
      queue_streams_.push_back(placement_.create_stream());
      placement_.hold_events_on(queue_streams_.back());
    }
    return queue_streams_[queue];
  }

  // A free that waited completes where the recording completed it.
  void free_completed(const Event& e) {
    if (deferred_events_.empty() && deferred_streams_.empty()) return;  // the common case: no free waits
    if (const auto it = deferred_events_.find(e.address); it != deferred_events_.end()) {
      placement_.complete_event(it->second);
      deferred_events_.erase(it);
      return;
    }
    const auto it = deferred_streams_.find(e.address);
    if (it == deferred_streams_.end()) return;
    placement_.synchronize_stream(it->second);
    deferred_streams_.erase(it);
  }

  EventSource& source_;
  const snapshot::Snapshot& head_;
  const AllocatorReplayOptions& options_;
  const ReplayPlan& plan_;
  PlacementDevice& placement_;
  ReplayResult& result_;
  ReplayedTotals engine_;  // the replayed run's totals and figures (not a layout engine)
  PeakTracker peaks_;
  LivePointers live_;
  std::vector<void*> held_;  // requests that failed in the recording and succeed here
  std::unordered_map<std::uint64_t, Stream> deferred_streams_;  // the ring start's pending blocks -> own stream
  std::unordered_map<std::uint64_t, DeviceEvent> deferred_events_;  // recorded block address -> its held event
  std::vector<Stream> queue_streams_;                                // one per queue of waiting frees
  std::vector<std::uint64_t> open_;                            // annotations
  std::size_t next_deferred_ = 0, next_empty_ = 0, next_route_ = 0, next_release_ = 0;
  std::uint64_t start_device_allocs_ = 0, start_device_frees_ = 0;  // the ring start's rebuild
  // The recorded reservation since the last request (the next request's), or kNoEvent.
  std::uint64_t recorded_reservation_ = kNoEvent;
  RecordedStreams streams_;  // before the allocator: the streams sort as recorded
  CachingAllocator allocator_;
  AllocatorControl control_;
};

}  // namespace

void replay_requests(EventSource& source, const AllocatorReplayOptions& options, ReplayPlan& plan,
                     ReplayResult& result) {
  auto simulated = make_simulated_device(plan.device_options);
  auto placement = std::make_shared<PlacementDevice>(simulated, options.placement, reservation_script(plan));
  for (const auto& segment : plan.initial.segments) plan.pass.streams.insert(segment.stream);
  {
    RequestReplay replay(source, options, plan, *placement, placement, result);
    replay.start();
    replay.run();
    replay.finish();
  }
  result.placed_as_recorded = placement->placed();
  result.placement_diverged = options.placement == Placement::recorded && placement->diverged();
}

}  // namespace cachealloc::analyzer::whatif
