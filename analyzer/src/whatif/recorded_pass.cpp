// The first pass over the recorded events: the recorded run's figures, and
// what the replay must do that the trace does not say outright (frees that
// waited for streams, the program's empty_cache calls, private pools).
#include <map>
#include <unordered_map>

#include "whatif/replay_parts.hpp"

namespace cachealloc::analyzer::whatif {

namespace {

using snapshot::Event;
using snapshot::EventKind;

// The recorded run's cap, where an OOM of `device` shows it; 0 when none does.
std::uint64_t oom_cap_of(EventSource& source, std::int32_t device) {
  std::uint64_t cap = 0;
  for_each_event(source, 0, source.event_count(), [&](std::size_t, const Event& e) {
    if (e.kind == EventKind::oom && e.device == device && e.aux != 0) {
      cap = e.aux;
      return false;
    }
    return true;
  });
  return cap;
}

// One walk of the recorded events through the layout engine.
class RecordedRunReader {
 public:
  RecordedRunReader(const snapshot::Snapshot& head, std::int32_t device, const InitialLayout& initial,
                    const AllocatorConfig& config, bool infer_empty_cache, std::uint64_t device_total)
      : head_(head),
        device_(device),
        config_(config),
        infer_empty_cache_(infer_empty_cache),
        device_total_(device_total),
        engine_(initial.segments, device, head.stacks.size(), Replay::sizes_may_be_inferred(head, device)),
        device_allocs_(0),  // the window's own: the ring start's segments were reserved before it
        pools_(config) {
    peaks_.after(engine_.totals(), kNoEvent);
  }

  // The cap of the recorded run: an OOM's (`oom_cap`), else the hint.
  void set_cap(std::uint64_t oom_cap, std::uint64_t hint) {
    pass_.oom_cap = oom_cap;
    cap_ = pass_.first_oom_cap = oom_cap != 0 ? oom_cap : hint;
  }

  bool on_event(std::size_t i, const Event& e) {
    if (e.kind == EventKind::annotation_begin || e.kind == EventKind::annotation_end) {
      annotate(open_, e);
      return true;
    }
    if (e.device != device_ || e.kind == EventKind::snapshot) return true;
    end_free(e);
    note_completion(e);
    if (infer_empty_cache_) track_release_run(i, e);
    if (is_request(e.kind)) track_peak_call(i);
    if (e.kind == EventKind::alloc && (pass_.streams.empty() || e.stream != last_stream_)) {
      pass_.streams.insert(e.stream);
      last_stream_ = e.stream;
    }
    count(i, e);
    pools_.before(i, e, engine_);
    engine_.apply(e);
    if (peaks_.after(engine_.totals(), i)) peak_call_done_ = false;
    return true;
  }

  RecordedPass finish() {
    pass_.pool_routes = std::move(pools_.routes);
    pass_.pool_releases = std::move(pools_.releases);
    pass_.private_pools = pools_.pools;
    if (free_open_) defer(free_address_, free_index_);
    assign_queues();
    if (run_open_) close_release_run(nullptr);
    peaks_.boundary(engine_);
    peaks_.fill(pass_.figures);
    pass_.figures.segments = engine_.totals().segments;
    pass_.figures.device_allocs = device_allocs_;
    pass_.figures.device_frees = device_frees_;
    pass_.figures.reserved_at_end = engine_.totals().reserved;
    pass_.figures.allocated_at_end = engine_.totals().allocated;
    if (const auto it = head_.stats.find("num_alloc_retries"); it != head_.stats.end() && head_.dropped_events == 0)
      pass_.figures.retries = static_cast<std::uint64_t>(it->second);
    return std::move(pass_);
  }

 private:
  // A free whose next event (splits and merges aside) is not its own
  // free_completed waited for other streams.
  void end_free(const Event& e) {
    if (!free_open_ || e.kind == EventKind::split || e.kind == EventKind::merge) return;
    if (!(e.kind == EventKind::free_completed && e.address == free_address_)) defer(free_address_, free_index_);
    free_open_ = false;
  }

  void defer(std::uint64_t address, std::uint64_t index) {
    waiting_[address] = pass_.deferred.size();
    pass_.deferred.push_back(index);
    completion_.push_back(kNever);
  }

  // The completion of a free that waited: its rank among completions.
  void note_completion(const Event& e) {
    if (e.kind != EventKind::free_completed || waiting_.empty()) return;
    const auto it = waiting_.find(e.address);
    if (it == waiting_.end()) return;
    completion_[it->second] = completions_++;
    waiting_.erase(it);
  }

  // Each waiting free joins the queue whose last free completes latest
  // before its own (patience sorting: the fewest queues in which every
  // queue completes in order); one that never completes ends its queue.
  void assign_queues() {
    std::multimap<std::uint64_t, std::uint32_t> tails;  // last completion -> queue
    std::uint32_t queues = 0;
    pass_.deferred_queue.reserve(completion_.size());
    for (const std::uint64_t done : completion_) {
      auto it = tails.lower_bound(done);
      std::uint32_t queue;
      if (it != tails.begin() && (--it)->first < done) {
        queue = it->second;
        tails.erase(it);
      } else {
        queue = queues++;
      }
      tails.emplace(done, queue);
      pass_.deferred_queue.push_back(queue);
    }
  }

  // PyTorch's traces have no empty_cache entry: a run of releases is the
  // program's empty_cache unless it is the allocator's own.
  void track_release_run(std::size_t i, const Event& e) {
    const bool releasing = e.kind == EventKind::segment_release || e.kind == EventKind::segment_unmap;
    if (run_open_ && !releasing) close_release_run(&e);
    if (!run_open_ && releasing) {
      run_open_ = true;
      run_start_ = i;
      reserved_before_run_ = engine_.totals().reserved;
    }
  }

  // The allocator's own: followed by an OOM, or by a reservation while the
  // reserved bytes plus the new segment exceed the cap, or while garbage
  // collection is due. `next`: the event after the run, nullptr at the end.
  void close_release_run(const Event* next) {
    run_open_ = false;
    bool allocators_own = false;
    if (next != nullptr && next->kind == EventKind::oom) {
      allocators_own = true;
    } else if (next != nullptr && (next->kind == EventKind::segment_alloc || next->kind == EventKind::segment_map)) {
      const std::uint64_t limit = cap_ != 0 ? cap_ : device_total_;
      allocators_own = reserved_before_run_ + next->size > limit ||
                       (cap_ != 0 && config_.garbage_collection_threshold > 0 &&
                        static_cast<double>(reserved_before_run_) >
                            config_.garbage_collection_threshold * static_cast<double>(cap_));
    }
    if (!allocators_own) pass_.empty_cache.push_back(run_start_);
  }

  // The call that reached a peak ends with its request (a reservation
  // comes first): the figures are read when the next call starts. The peak's
  // event stays the one that reached it, the reservation, as in summary.
  void track_peak_call(std::size_t) {
    if (peak_call_done_) {
      peaks_.boundary(engine_);
      peak_call_done_ = false;
    } else if (peaks_.pending) {
      peak_call_done_ = true;
    }
  }

  void count(std::size_t i, const Event& e) {
    switch (e.kind) {
      case EventKind::free_requested:
        free_open_ = true;
        free_address_ = e.address;
        free_index_ = i;
        break;
      case EventKind::segment_alloc:
        pass_.reservations.emplace_back(e.address, e.size);
        ++device_allocs_;
        break;
      case EventKind::segment_release: ++device_frees_; break;
      // Expandable segments: PyTorch counts each map and unmap as a device
      // call (num_device_alloc/free), as Analysis::device_allocs() does.
      case EventKind::segment_map: ++device_allocs_; break;
      case EventKind::segment_unmap: ++device_frees_; break;
      case EventKind::oom:
        ++pass_.figures.ooms;
        if (!pass_.figures.first_oom) pass_.figures.first_oom = OomPoint{i, e.size, annotation_path(head_, open_)};
        break;
      default: break;
    }
  }

  const snapshot::Snapshot& head_;
  const std::int32_t device_;
  const AllocatorConfig& config_;
  const bool infer_empty_cache_;
  const std::uint64_t device_total_;
  std::uint64_t cap_ = 0;
  RecordedPass pass_;
  Replay engine_;
  PeakTracker peaks_;
  std::vector<std::uint64_t> open_;  // annotations
  std::uint64_t device_allocs_, device_frees_ = 0;
  std::uint64_t last_stream_ = 0;  // the last alloc's: requests come in runs on one stream
  bool free_open_ = false, peak_call_done_ = false;
  std::uint64_t free_address_ = 0, free_index_ = 0;
  bool run_open_ = false;
  std::uint64_t run_start_ = 0, reserved_before_run_ = 0;
  PoolInference pools_;
  static constexpr std::uint64_t kNever = ~std::uint64_t{0};
  std::unordered_map<std::uint64_t, std::size_t> waiting_;  // address -> its index in deferred
  std::vector<std::uint64_t> completion_;                   // per deferred: rank of its completion, or kNever
  std::uint64_t completions_ = 0;
};

}  // namespace

RecordedPass recorded_pass(EventSource& source, std::int32_t device, const InitialLayout& initial,
                           const AllocatorConfig& config, std::uint64_t recorded_cap_hint, bool infer_empty_cache,
                           std::uint64_t device_total) {
  RecordedRunReader reader(source.head(), device, initial, config, infer_empty_cache, device_total);
  reader.set_cap(oom_cap_of(source, device), recorded_cap_hint);
  for_each_event(source, 0, source.event_count(), [&](std::size_t i, const Event& e) { return reader.on_event(i, e); });
  return reader.finish();
}

}  // namespace cachealloc::analyzer::whatif
