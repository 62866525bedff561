#include "cachealloc/analyzer/allocator_replay.hpp"

#include <algorithm>
#include <iterator>
#include <limits>
#include <charconv>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>

#include "cachealloc/allocator.hpp"
#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/replay.hpp"
#include "cachealloc/config.hpp"
#include "cachealloc/device.hpp"
#include "cachealloc/errors.hpp"
#include "cachealloc/snapshot/ring_start.hpp"

namespace cachealloc::analyzer {
namespace {

using snapshot::Event;
using snapshot::EventKind;

// Model-placed reservations sit above every recorded address (recorded ones
// are below 128 TiB, the simulated device's ranges below 192 TiB).
constexpr std::uintptr_t kModelOffset = std::uintptr_t{1} << 48;

// Forwards to the simulated device; under Placement::recorded, answers each
// reservation with the recording's address while the replay reserves what the
// recording did, in the same order, and the address is not in use.
class PlacementDevice final : public ForwardingDevice {
 public:
  PlacementDevice(std::shared_ptr<Device> inner, Placement placement,
                  std::vector<std::pair<std::uint64_t, std::uint64_t>> script)
      : ForwardingDevice(std::move(inner)), recorded_(placement == Placement::recorded), script_(std::move(script)) {}
  void* reserve(std::size_t bytes) override {
    void* inner = inner_->reserve(bytes);
    if (inner == nullptr) return nullptr;
    std::uintptr_t address = reinterpret_cast<std::uintptr_t>(inner);
    if (recorded_) {
      if (!diverged_ && next_ < script_.size() && script_[next_].second == bytes && free_range(script_[next_].first, bytes)) {
        address = script_[next_++].first;
        ++placed_;
      } else {
        diverged_ = true;
        address += kModelOffset;
      }
      live_[address] = bytes;
      translate_[address] = reinterpret_cast<std::uintptr_t>(inner);
    }
    return reinterpret_cast<void*>(address);
  }
  void release(void* ptr, std::size_t bytes) override {
    if (!recorded_) return inner_->release(ptr, bytes);
    const auto address = reinterpret_cast<std::uintptr_t>(ptr);
    const auto it = translate_.find(address);
    if (it == translate_.end()) throw DeviceError("replay: release of an address never reserved");
    inner_->release(reinterpret_cast<void*>(it->second), bytes);
    translate_.erase(it);
    live_.erase(address);
  }

  std::uint64_t placed() const noexcept { return placed_; }
  bool diverged() const noexcept { return diverged_; }

 private:
  bool free_range(std::uint64_t address, std::uint64_t bytes) const {
    auto it = live_.lower_bound(address);
    if (it != live_.end() && it->first < address + bytes) return false;
    if (it != live_.begin()) {
      --it;
      if (it->first + it->second > address) return false;
    }
    return true;
  }

  bool recorded_;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> script_;
  std::size_t next_ = 0;
  bool diverged_ = false;
  std::uint64_t placed_ = 0;
  std::map<std::uint64_t, std::uint64_t> live_;
  std::unordered_map<std::uint64_t, std::uint64_t> translate_;
};

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
  void watch(CachingAllocator& allocator) noexcept {
    allocator_ = &allocator;
    allocator.set_observer(this);
  }
  std::uint32_t on_event(const AllocatorEvent& e) noexcept override {
    switch (e.kind) {
      case EventKind::alloc:
        totals_.allocated += e.size;
        totals_.active += e.size;
        break;
      case EventKind::free_requested: totals_.allocated -= e.size; break;
      case EventKind::free_completed: totals_.active -= e.size; break;
      case EventKind::segment_alloc:
      case EventKind::segment_map: totals_.reserved += e.size; break;
      case EventKind::segment_release:
      case EventKind::segment_unmap: totals_.reserved -= e.size; break;
      default: break;
    }
    return 0;
  }
  // Only allocated, active and reserved are kept.
  const Totals& totals() const noexcept { return totals_; }
  // cached_free and largest_free, as Replay::cache_figures gives them.
  CacheFigures cache_figures(bool /*with_largest_free*/) const {
    CacheFigures f;
    f.cached_free = totals_.reserved > totals_.active ? totals_.reserved - totals_.active : 0;
    if (allocator_ != nullptr) f.largest_free = allocator_->largest_free_block();
    return f;
  }

 private:
  Totals totals_;
  const CachingAllocator* allocator_ = nullptr;
};

class Control final : public ReplayControl {
 public:
  explicit Control(CachingAllocator& allocator) : allocator_(allocator) {}
  MemoryStats stats() const override { return allocator_.stats(); }
  void reset_peak_stats() override { allocator_.reset_peak_stats(); }

 private:
  CachingAllocator& allocator_;
};

// Peak tracking with the fragmentation read at the first request boundary
// after each new peak (at the segment_alloc itself the new segment is still
// one free block).
struct PeakTracker {
  std::uint64_t peak_reserved = 0, peak_allocated = 0, peak_event = 0;
  bool pending = false;
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

bool is_request(EventKind kind) {
  return kind == EventKind::alloc || kind == EventKind::oom || kind == EventKind::free_requested ||
         kind == EventKind::empty_cache;
}

std::string setting(const snapshot::Snapshot& head, const std::string& key) {
  const auto it = head.settings.find(key);
  return it == head.settings.end() ? std::string() : it->second;
}

// The recorded settings. Ours keep the CACHEALLOC_CONF text; PyTorch's
// allocator_settings keep each value (its PYTORCH_CUDA_ALLOC_CONF text may
// hold keys that are not the allocator's).
AllocatorConfig recorded_config(const snapshot::Snapshot& head, bool& known) {
  known = true;
  if (head.header.source != "pytorch-pickle") {
    const auto it = head.settings.find("config");
    if (it == head.settings.end()) {
      known = false;
      return {};
    }
    return parse_config(it->second);
  }
  AllocatorConfig config;
  if (head.settings.find("expandable_segments") == head.settings.end()) {
    known = false;
    for (const auto& segment : head.segments) config.expandable_segments |= segment.expandable;
    return config;
  }
  config.expandable_segments = setting(head, "expandable_segments") == "True";
  const std::string split = setting(head, "max_split_size");
  long long value = -1;
  std::from_chars(split.data(), split.data() + split.size(), value);
  if (value > 0) config.max_split_size = static_cast<std::size_t>(value);
  const std::string gc = setting(head, "garbage_collection_threshold");
  if (!gc.empty()) config.garbage_collection_threshold = std::strtod(gc.c_str(), nullptr);
  for (std::size_t i = 0; i < kRoundupIntervals; ++i) {
    const std::string d = setting(head, "roundup_power2_divisions." + std::to_string(std::size_t{1} << i));
    std::size_t divisions = 0;
    std::from_chars(d.data(), d.data() + d.size(), divisions);
    config.roundup_power2_divisions[i] = divisions;
  }
  if (const std::string all = setting(head, "roundup_power2_divisions"); !all.empty()) {
    std::size_t divisions = 0;  // older PyTorch: one value for every size
    const auto [stop, error] = std::from_chars(all.data(), all.data() + all.size(), divisions);
    if (error == std::errc{} && stop == all.data() + all.size()) config.roundup_power2_divisions.fill(divisions);
  }
  return config;
}

std::string annotation_path(const snapshot::Snapshot& head, const std::vector<std::uint64_t>& open) {
  std::string path;
  for (const std::uint64_t id : open) {
    if (!path.empty()) path += '/';
    path += id < head.strings.size() ? head.strings[id] : "?";
  }
  return path;
}

void annotate(std::vector<std::uint64_t>& open, const Event& event) {
  if (event.kind == EventKind::annotation_begin) {
    open.push_back(event.aux);
  } else {
    const auto it = std::find(open.rbegin(), open.rend(), event.aux);
    if (it != open.rend()) open.erase(std::next(it).base());
  }
}

// In a large pool the allocator splits a block only when more than 1 MiB
// would remain, and free neighbours merge: a free block of at most 1 MiB
// there is the unsplit tail of the block before it, whose size a PyTorch
// trace gives only as its request (the ring-start derivation then sees a
// gap). Joins each such fragment to that block; returns how many.
std::uint64_t join_impossible_fragments(std::vector<snapshot::Segment>& segments) {
  constexpr std::uint64_t kSmallSize = std::uint64_t{1} << 20;
  std::uint64_t joined = 0;
  for (auto& segment : segments) {
    if (!segment.large_pool || segment.expandable) continue;
    auto& blocks = segment.blocks;
    for (std::size_t i = 1; i < blocks.size();) {
      if (blocks[i].state == snapshot::BlockState::inactive && blocks[i].size <= kSmallSize &&
          blocks[i - 1].state != snapshot::BlockState::inactive) {
        blocks[i - 1].size += blocks[i].size;
        blocks.erase(blocks.begin() + static_cast<std::ptrdiff_t>(i));
        ++joined;
      } else {
        ++i;
      }
    }
  }
  return joined;
}

InitialLayout initial_layout(EventSource& source, std::int32_t device) {
  const snapshot::Snapshot& head = source.head();
  if (const snapshot::RingStart* stored = snapshot::find_ring_start(head, device)) return *stored;
  const bool may_begin_mid_run = head.dropped_events > 0 || setting(head, "trace_may_begin_mid_run") == "true";
  if (!may_begin_mid_run) return InitialLayout{device, {}, 0, 0};
  return derive_initial_layout(source, device);
}

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
  void before(std::size_t i, const Event& e, const Replay& engine) {
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
      case EventKind::segment_release: {
        // (Our recorder's empty_cache event follows its releases.)
        if (previous != EventKind::segment_release) run_start_ = i;
        const auto it = segments_.find(e.address);
        if (it == segments_.end()) return;
        const std::uint32_t pool = it->second.second;
        segments_.erase(it);
        if (released_.insert(pool).second) {
          releases.push_back({run_start_, pool});
          std::erase_if(open_, [pool](const auto& entry) { return entry.second == pool; });
        }
        return;
      }
      case EventKind::alloc: break;
      default: return;
    }
    const bool fresh = reserved_before_ && previous == EventKind::segment_alloc && reserved_address_ == e.address;
    reserved_before_ = false;
    std::uint32_t pool = 0;
    const auto open = open_.find(e.stream);
    if (fresh) {
      const std::uint64_t size = e.size;
      if (open != open_.end()) {
        if (fits(engine, e.stream, size, open->second)) open_.erase(open);  // the capture has ended
        else pool = open->second;
      }
      if (pool == 0 && fits(engine, e.stream, size, 0)) {
        pool = ++pools;
        open_[e.stream] = pool;
      }
      if (pool != 0) segments_[reserved_address_] = {reserved_address_ + reserved_size_, pool};
    } else if (!segments_.empty()) {
      pool = pool_at(e.address);
      if (open != open_.end() && pool != open->second) open_.erase(open);
    }
    if (pool != 0 && !released_.contains(pool)) routes.push_back({i, pool});
  }

 private:
  std::uint32_t pool_at(std::uint64_t address) const {
    auto it = segments_.upper_bound(address);
    if (it == segments_.begin()) return 0;
    --it;
    return address < it->second.first ? it->second.second : 0;
  }
  // Whether `pool` held, on `stream`, a free block that PyTorch's best fit
  // takes for a block of `size` bytes (the segment just reserved aside). Reads
  // each segment's largest free block: where max_split_size turns that one
  // away, a smaller one that fits is not seen, and no pool is inferred. Under
  // a max_split_size an oversize block is not split, and a PyTorch trace
  // sizes it by its request: the free block seen after it may not exist, so
  // large-pool segments are then no evidence.
  bool fits(const Replay& engine, std::uint64_t stream, std::uint64_t size, std::uint32_t pool) const {
    constexpr std::uint64_t kSmallSize = std::uint64_t{1} << 20;
    if (engine.cache_figures(false).cached_free < size) return false;
    const bool small = size <= kSmallSize;
    if (!small && config_.max_split_size != std::numeric_limits<std::size_t>::max()) return false;
    for (const SegmentFigures& s : engine.segment_figures()) {
      if (s.stream != stream || s.large_pool == small || s.address == reserved_address_ || s.expandable) continue;
      if (pool_at(s.address) != pool || s.largest_free < size) continue;
      const std::uint64_t block = s.largest_free;
      if (size < config_.max_split_size && block >= config_.max_split_size) continue;
      if (size >= config_.max_split_size && block >= size + config_.max_non_split_rounding) continue;
      return true;
    }
    return false;
  }

  const AllocatorConfig& config_;
  EventKind previous_ = EventKind::snapshot;
  bool reserved_before_ = false;
  std::uint64_t reserved_address_ = 0, reserved_size_ = 0;
  std::uint64_t run_start_ = 0;
  std::map<std::uint64_t, std::pair<std::uint64_t, std::uint32_t>> segments_;  // private: address -> (end, pool)
  std::map<std::uint64_t, std::uint32_t> open_;                                // stream -> its capture's pool
  std::set<std::uint32_t> released_;
};

// What the first pass learns about the recorded run.
struct RecordedPass {
  RunFigures figures;
  std::vector<std::uint64_t> deferred;     // indices of free_requested that waited for streams
  std::vector<std::uint64_t> empty_cache;  // indices before which the program called empty_cache
  std::vector<std::pair<std::uint64_t, std::uint64_t>> reservations;  // (address, size) in order
  std::uint64_t first_oom_cap = 0;  // the recorded cap: an OOM's, else the hint
  std::uint64_t oom_cap = 0;        // an OOM's alone
  std::set<std::uint64_t> streams;  // every stream the requests name
  std::vector<PoolInference::Route> pool_routes, pool_releases;
  std::uint32_t private_pools = 0;
};

// The fraction whose cap, as the allocator computes it (fraction x total,
// truncated), is exactly `cap` bytes.
double fraction_for_cap(std::uint64_t cap, std::uint64_t total) {
  const double t = static_cast<double>(total);
  double fraction = static_cast<double>(cap) / t;
  for (int i = 0; i < 64 && static_cast<std::uint64_t>(fraction * t) < cap; ++i)
    fraction = std::nextafter(fraction, 2.0);
  for (int i = 0; i < 64 && static_cast<std::uint64_t>(fraction * t) > cap; ++i)
    fraction = std::nextafter(fraction, 0.0);
  return fraction;
}

RecordedPass recorded_pass(EventSource& source, std::int32_t device, const InitialLayout& initial,
                           const AllocatorConfig& config, std::uint64_t recorded_cap_hint, bool infer_empty_cache,
                           std::uint64_t device_total) {
  const snapshot::Snapshot& head = source.head();
  RecordedPass pass;
  Replay engine(initial.segments, device, head.stacks.size());
  PeakTracker peaks;
  peaks.after(engine.totals(), 0);
  std::vector<std::uint64_t> open;
  std::uint64_t device_allocs = initial.segments.size(), device_frees = 0;
  // The cap of the recorded run: an oom event's, else the hint.
  std::uint64_t cap = recorded_cap_hint;
  for_each_event(source, 0, source.event_count(), [&](std::size_t, const Event& e) {
    if (e.kind == EventKind::oom && e.device == device && e.aux != 0) {
      cap = pass.oom_cap = e.aux;
      return false;
    }
    return true;
  });
  pass.first_oom_cap = cap;
  std::uint64_t last_stream = 0;  // the last alloc's: requests come in runs on one stream
  bool free_open = false, peak_call_done = false;
  std::uint64_t free_address = 0, free_index = 0;
  bool run_open = false;
  std::uint64_t run_start = 0, reserved_before_run = 0;
  PoolInference pools(config);
  auto close_run = [&](const Event* next) {
    run_open = false;
    bool allocators_own = false;
    if (next != nullptr && next->kind == EventKind::oom) {
      allocators_own = true;
    } else if (next != nullptr && (next->kind == EventKind::segment_alloc || next->kind == EventKind::segment_map)) {
      const std::uint64_t limit = cap != 0 ? cap : device_total;
      allocators_own = reserved_before_run + next->size > limit ||
                       (cap != 0 && config.garbage_collection_threshold > 0 &&
                        static_cast<double>(reserved_before_run) > config.garbage_collection_threshold * static_cast<double>(cap));
    }
    if (!allocators_own) pass.empty_cache.push_back(run_start);
  };
  for_each_event(source, 0, source.event_count(), [&](std::size_t i, const Event& e) {
    const bool annotation = e.kind == EventKind::annotation_begin || e.kind == EventKind::annotation_end;
    if (annotation) {
      annotate(open, e);
      return true;
    }
    if (e.device != device || e.kind == EventKind::snapshot) return true;
    if (free_open && e.kind != EventKind::split && e.kind != EventKind::merge) {
      if (!(e.kind == EventKind::free_completed && e.address == free_address)) pass.deferred.push_back(free_index);
      free_open = false;
    }
    const bool releasing = e.kind == EventKind::segment_release || e.kind == EventKind::segment_unmap;
    if (infer_empty_cache) {
      if (run_open && !releasing) close_run(&e);
      if (!run_open && releasing) {
        run_open = true;
        run_start = i;
        reserved_before_run = engine.totals().reserved;
      }
    }
    // The call that reached a peak ends with its request (a reservation
    // comes first): the figures are read when the next call starts.
    if (is_request(e.kind)) {
      if (peak_call_done) {
        peaks.boundary(engine);
        peak_call_done = false;
      } else if (peaks.pending) {
        peak_call_done = true;
        peaks.peak_event = i;  // the request that reached it
      }
    }
    if (e.kind == EventKind::alloc && (pass.streams.empty() || e.stream != last_stream)) {
      pass.streams.insert(e.stream);
      last_stream = e.stream;
    }
    switch (e.kind) {
      case EventKind::free_requested:
        free_open = true;
        free_address = e.address;
        free_index = i;
        break;
      case EventKind::segment_alloc:
        pass.reservations.emplace_back(e.address, e.size);
        ++device_allocs;
        break;
      case EventKind::segment_release: ++device_frees; break;
      // Expandable segments: PyTorch counts each map and unmap as a device
      // call (num_device_alloc/free), as Analysis::device_allocs() does.
      case EventKind::segment_map: ++device_allocs; break;
      case EventKind::segment_unmap: ++device_frees; break;
      case EventKind::oom:
        ++pass.figures.ooms;
        if (!pass.figures.first_oom) pass.figures.first_oom = OomPoint{i, e.size, annotation_path(head, open)};
        break;
      default: break;
    }
    pools.before(i, e, engine);
    engine.apply(e);
    if (peaks.after(engine.totals(), i)) peak_call_done = false;
    return true;
  });
  pass.pool_routes = std::move(pools.routes);
  pass.pool_releases = std::move(pools.releases);
  pass.private_pools = pools.pools;
  if (free_open) pass.deferred.push_back(free_index);
  if (run_open) close_run(nullptr);
  peaks.boundary(engine);
  peaks.fill(pass.figures);
  pass.figures.segments = engine.totals().segments;
  pass.figures.device_allocs = device_allocs;
  pass.figures.device_frees = device_frees;
  pass.figures.reserved_at_end = engine.totals().reserved;
  pass.figures.allocated_at_end = engine.totals().allocated;
  if (const auto it = head.stats.find("num_alloc_retries"); it != head.stats.end() && head.dropped_events == 0)
    pass.figures.retries = static_cast<std::uint64_t>(it->second);
  return pass;
}

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

}  // namespace

AllocatorConfig recorded_settings(const snapshot::Snapshot& head, bool& known) { return recorded_config(head, known); }

std::string settings_with(std::string base, const std::vector<std::string>& set) {
  for (const std::string& given : set) {
    std::string pair = given;
    const auto equals = pair.find('=');
    if (equals != std::string::npos) pair[equals] = ':';
    if (pair.find(':') == std::string::npos || pair.front() == ':')
      throw ConfigError("--set " + given + ": expected KEY=VALUE, a CACHEALLOC_CONF key and its value");
    try {
      (void)parse_config(pair);
    } catch (const ConfigError& error) {
      // The parser's own words, without its "CACHEALLOC_CONF: 'key:value': " lead.
      std::string why = error.what();
      if (why.starts_with("CACHEALLOC_CONF: ")) why.erase(0, 17);
      if (why.starts_with("'"))
        if (const auto end = why.find("': "); end != std::string::npos) why.erase(0, end + 3);
      throw ConfigError("--set " + given + ": " + why);
    }
    base += (base.empty() ? "" : ",") + pair;
  }
  return base;
}

ReplayResult replay_allocator(EventSource& source, const AllocatorReplayOptions& options) {
  const snapshot::Snapshot& head = source.head();
  ReplayResult result;
  result.device = pick_device(source, options.device);
  result.events = source.event_count();
  if (result.events == 0) throw InvalidArgument("the file holds no trace (segments only): there are no requests to replay");
  const std::int32_t device = result.device;

  AllocatorConfig base = recorded_config(head, result.settings_known);
  if (!result.settings_known) result.notes.push_back("the file holds no allocator settings: PyTorch's defaults assumed");
  result.recorded_config = to_string(base);
  const AllocatorConfig config =
      options.config ? *options.config : parse_config(settings_with(result.recorded_config, options.set));
  result.replayed_config = to_string(config);

  SimulatedDeviceOptions device_options = simulated_h200_options();
  for (const auto& info : head.devices) {
    if (info.index == device && info.total_bytes != 0) {
      device_options.capacity = info.total_bytes;
      result.device_total_known = true;
    }
  }
  if (!result.device_total_known) {
    // PyTorch's snapshots hold no device total. The simulated device is an
    // H200's size, or the capacity asked for when that is larger (a B200).
    if (options.capacity && *options.capacity > device_options.capacity) device_options.capacity = *options.capacity;
    result.notes.push_back("the snapshot holds no device total (PyTorch's snapshots record none): the simulated device "
                           "has " + std::to_string(device_options.capacity) +
                           " bytes, an H200's; a run on a smaller GPU runs out sooner: give its size with --capacity");
  }
  result.device_total = device_options.capacity;
  if (options.fraction && options.capacity) throw InvalidArgument("--fraction and --capacity exclude each other");
  double fraction = 0;
  if (options.fraction) {
    if (!(*options.fraction > 0 && *options.fraction <= 1)) throw InvalidArgument("the fraction must be within (0, 1]");
    fraction = *options.fraction;
  } else if (options.capacity) {
    if (*options.capacity == 0 || *options.capacity > result.device_total)
      throw InvalidArgument("the capacity must be between 1 byte and the device total, " +
                            std::to_string(result.device_total) + " bytes");
  }
  if (options.capacity) fraction = fraction_for_cap(*options.capacity, result.device_total);
  if (!(options.scale > 0 && options.scale <= 1024)) throw InvalidArgument("the request scale must be within (0, 1024]");

  InitialLayout initial = initial_layout(source, device);
  result.joined_fragments = join_impossible_fragments(initial.segments);
  if (result.joined_fragments != 0)
    result.notes.push_back(std::to_string(result.joined_fragments) +
                           " free fragments of at most 1 MiB in large-pool segments at the ring's start (which the "
                           "allocator never leaves: it does not split off so little) joined to the block before each, "
                           "whose size the trace gave only as its request");
  result.starts_mid_run = !initial.segments.empty();
  result.initial_segments = initial.segments.size();
  for (const auto& segment : initial.segments)
    if (segment.expandable)
      throw InvalidArgument("the trace begins mid-run with expandable segments, which the replay cannot rebuild");

  const double recorded_fraction = options.recorded_fraction.value_or(options.fraction.value_or(0));
  const std::uint64_t cap_hint = static_cast<std::uint64_t>(recorded_fraction * static_cast<double>(result.device_total));
  RecordedPass pass = recorded_pass(source, device, initial, base, cap_hint, head.header.source == "pytorch-pickle",
                                    result.device_total);
  result.recorded = pass.figures;
  result.recorded_cap = pass.first_oom_cap;
  // Its own settings include its cap, when the recording shows one.
  if (!options.fraction && !options.capacity && pass.oom_cap != 0) {
    fraction = fraction_for_cap(pass.oom_cap, result.device_total);
    result.notes.push_back("the recorded cap (" + std::to_string(pass.oom_cap) + " bytes, from its OOM) applies");
  }
  result.cap = fraction == 0 ? 0 : static_cast<std::uint64_t>(fraction * static_cast<double>(result.device_total));
  result.inferred_empty_cache = pass.empty_cache.size();
  result.deferred_frees = pass.deferred.size();
  result.inferred_private_pools = pass.private_pools;
  result.private_pool_requests = pass.pool_routes.size();
  if (pass.private_pools != 0)
    result.notes.push_back(std::to_string(pass.private_pools) +
                           (pass.private_pools == 1 ? " private memory pool" : " private memory pools") +
                           " inferred (CUDA graph captures or MemPools: segments reserved while a default-pool "
                           "block on the stream fitted), " +
                           std::to_string(pass.pool_routes.size()) + " requests replayed in them");

  // The allocator, on the simulated device, placed as the recording was.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> script;
  for (const auto& segment : initial.segments) script.emplace_back(segment.address, segment.total_size);
  script.insert(script.end(), pass.reservations.begin(), pass.reservations.end());
  auto simulated = make_simulated_device(device_options);
  auto placement = std::make_shared<PlacementDevice>(simulated, options.placement, std::move(script));
  ReplayedTotals engine;  // the replayed run's totals and figures (not a layout engine)
  PeakTracker peaks;
  LivePointers live;
  std::vector<void*> held;  // requests that failed in the recording and succeed here
  std::unordered_map<std::uint64_t, Stream> deferred_streams;  // recorded block address -> its own stream
  // The recorded streams, created in the order of their handles, so that
  // streams sort as they did in the recording.
  std::map<std::uint64_t, Stream> streams;
  for (const auto& segment : initial.segments) pass.streams.insert(segment.stream);
  for (const std::uint64_t handle : pass.streams)
    if (handle != 0) streams[handle] = placement->create_stream();
  // Requests come in runs on one stream: the last answer first.
  std::uint64_t last_recorded = 0;
  Stream last_stream{};
  auto stream_of = [&](std::uint64_t recorded) {
    if (recorded == 0) return Stream{};
    if (recorded == last_recorded) return last_stream;
    auto [it, added] = streams.try_emplace(recorded);
    if (added) it->second = placement->create_stream();
    last_recorded = recorded;
    last_stream = it->second;
    return last_stream;
  };
  {
    CachingAllocator allocator(placement, config);
    engine.watch(allocator);
    Control control(allocator);

    // The ring's start: every segment, then every block in address order
    // (each cut from the front of the segment's free remainder), all held;
    // then the free and pending ones let go.
    std::vector<std::pair<const snapshot::Block*, void*>> built;
    std::vector<void*> spacers;
    for (const auto& segment : initial.segments) {
      const Stream stream = stream_of(segment.stream);
      std::vector<void*> whole;
      try {
        if (segment.large_pool) {
          whole.push_back(allocator.allocate(segment.total_size, stream));
        } else {
          for (std::uint64_t at = 0; at < segment.total_size; at += std::uint64_t{1} << 20)
            whole.push_back(allocator.allocate(std::uint64_t{1} << 20, stream));
        }
        for (void* p : whole) allocator.deallocate(p);
        for (const auto& block : segment.blocks) {
          if (block.state != snapshot::BlockState::inactive) {
            built.emplace_back(&block, allocator.allocate(block.size, stream));
            continue;
          }
          // A free block of the small pool may exceed the small pool's
          // largest request: cut it in requests of at most 1 MiB (they
          // merge again when let go).
          const std::uint64_t piece = segment.large_pool ? block.size : std::uint64_t{1} << 20;
          for (std::uint64_t at = 0; at < block.size; at += piece)
            spacers.push_back(allocator.allocate(std::min(piece, block.size - at), stream));
        }
      } catch (const OutOfMemoryError&) {
        throw InvalidArgument("the layout at the ring's start does not fit the replay's device");
      }
    }
    for (void* ptr : spacers) allocator.deallocate(ptr);
    for (const auto& [block, ptr] : built) {
      if (block->state == snapshot::BlockState::active_allocated) {
        live.put(block->address, ptr);
      } else {
        const Stream side = placement->create_stream();
        allocator.record_stream(ptr, side);
        allocator.deallocate(ptr);
        deferred_streams[block->address] = side;
      }
    }
    if (result.starts_mid_run) {
      // Each segment of the start against what the allocator laid out: its
      // size, pool and blocks (sizes and whether free), in address order.
      auto shape = [](const snapshot::Segment& segment) {
        std::vector<std::uint64_t> out{segment.total_size, segment.large_pool ? 1u : 0u};
        for (const auto& block : segment.blocks) out.push_back(block.size * 2 + (block.state == snapshot::BlockState::inactive));
        return out;
      };
      std::vector<std::vector<std::uint64_t>> wanted, got;
      for (const auto& segment : initial.segments) wanted.push_back(shape(segment));
      for (const auto& segment : allocator.layout()) got.push_back(shape(segment));
      std::sort(wanted.begin(), wanted.end());
      std::sort(got.begin(), got.end());
      std::vector<std::vector<std::uint64_t>> missing;
      std::set_difference(wanted.begin(), wanted.end(), got.begin(), got.end(), std::back_inserter(missing));
      result.initial_blocks_not_rebuilt = missing.size();
      allocator.reset_peak_stats();
    }
    if (fraction != 0) allocator.set_memory_fraction(fraction);
    peaks.after(engine.totals(), 0);

    std::vector<std::uint64_t> open;
    std::size_t next_deferred = 0, next_empty = 0, next_route = 0, next_release = 0;
    const auto& deferred = pass.deferred;
    const auto& empties = pass.empty_cache;
    auto oom_at = [&](std::size_t i, std::uint64_t bytes) {
      if (!result.replayed.first_oom) result.replayed.first_oom = OomPoint{i, bytes, annotation_path(head, open)};
    };
    for_each_event(source, 0, source.event_count(), [&](std::size_t i, const Event& e) {
      if (e.kind == EventKind::annotation_begin || e.kind == EventKind::annotation_end) {
        annotate(open, e);
        if (options.on_annotation) {
          const std::string_view name = e.aux < head.strings.size() ? std::string_view(head.strings[e.aux]) : std::string_view();
          options.on_annotation(e, name, control);
        }
        return true;
      }
      if (e.device != device) return true;
      for (; next_release < pass.pool_releases.size() && pass.pool_releases[next_release].event == i; ++next_release) {
        const PrivatePoolId pool{0, pass.pool_releases[next_release].pool};
        if (allocator.pool_use_count(pool) > 0) allocator.release_pool(pool);
      }
      if (next_empty < empties.size() && empties[next_empty] == i) {
        ++next_empty;
        peaks.boundary(engine);
        allocator.empty_cache();
      }
      switch (e.kind) {
        case EventKind::alloc:
        case EventKind::oom: {
          peaks.boundary(engine);
          ++result.requests;
          std::uint64_t bytes = e.kind == EventKind::oom ? e.size : (e.aux != 0 ? e.aux : e.size);
          if (options.scale != 1.0)
            bytes = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::llround(static_cast<double>(bytes) * options.scale)));
          const bool to_pool = next_route < pass.pool_routes.size() && pass.pool_routes[next_route].event == i;
          const PrivatePoolId pool{0, to_pool ? pass.pool_routes[next_route++].pool : 0};
          try {
            void* ptr = to_pool ? allocate_in_pool(allocator, pool, bytes, stream_of(e.stream))
                                : allocator.allocate(bytes, stream_of(e.stream));
            if (e.kind == EventKind::alloc) live.put(e.address, ptr);
            else held.push_back(ptr);
          } catch (const OutOfMemoryError&) {
            oom_at(i, bytes);
          }
          break;
        }
        case EventKind::free_requested: {
          peaks.boundary(engine);
          const bool waits = next_deferred < deferred.size() && deferred[next_deferred] == i;
          if (waits) ++next_deferred;
          void* ptr = live.take(e.address);
          if (ptr == nullptr) break;  // its alloc failed here, or it predates a damaged start
          if (waits) {
            const Stream side = placement->create_stream();
            allocator.record_stream(ptr, side);
            deferred_streams[e.address] = side;
          }
          allocator.deallocate(ptr);
          break;
        }
        case EventKind::free_completed: {
          if (deferred_streams.empty()) break;  // the common case: no free waits
          const auto it = deferred_streams.find(e.address);
          if (it != deferred_streams.end()) {
            placement->synchronize_stream(it->second);
            deferred_streams.erase(it);
          }
          break;
        }
        case EventKind::empty_cache:
          peaks.boundary(engine);
          allocator.empty_cache();
          break;
        default: break;
      }
      peaks.after(engine.totals(), i);
      return true;
    });
    peaks.boundary(engine);
    peaks.fill(result.replayed);
    const MemoryStats stats = allocator.stats();
    result.replayed.segments = static_cast<std::uint64_t>(stats.segment[stat_all].current);
    result.replayed.device_allocs = static_cast<std::uint64_t>(stats.num_device_alloc);
    result.replayed.device_frees = static_cast<std::uint64_t>(stats.num_device_free);
    result.replayed.retries = static_cast<std::uint64_t>(stats.num_alloc_retries);
    result.replayed.ooms = static_cast<std::uint64_t>(stats.num_ooms);
    result.replayed.reserved_at_end = static_cast<std::uint64_t>(stats.reserved_bytes[stat_all].current);
    result.replayed.allocated_at_end = static_cast<std::uint64_t>(stats.allocated_bytes[stat_all].current);
    allocator.set_observer(nullptr);
    // The allocator's destructor returns everything to the device; the
    // program's live blocks are dropped with it.
  }
  result.placed_as_recorded = placement->placed();
  result.placement_diverged = options.placement == Placement::recorded && placement->diverged();
  if (result.initial_blocks_not_rebuilt != 0)
    result.notes.push_back(std::to_string(result.initial_blocks_not_rebuilt) +
                           " segments of the ring's start could not be laid out block for block as recorded");
  return result;
}

}  // namespace cachealloc::analyzer
