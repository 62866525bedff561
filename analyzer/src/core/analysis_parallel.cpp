// The parallel analysis (AnalysisOptions::threads), in three steps:
//  1. Effects, one thread per range but the last: what the range's events
//     leave behind, per block address (allocated, pending, gone) and per
//     segment address (there, gone), and its annotation events.
//  2. The state at each range's start, on the calling thread: the layout
//     before the trace with the effects of the ranges before applied, in
//     O(addresses each range touched + live blocks) per range, never
//     O(events).
//  3. Passes, one thread per range: a Replay from that state and a
//     WindowPass (analysis_pass.hpp) over the range; the first range's runs
//     at once, beside step 1. The figures are then merged in event order.
// The effects follow Replay's rules for a trace it can explain: free blocks
// are the gaps between active ones, merged. Anything outside that (an event
// the effects cannot explain, expandable memory, a Replay anomaly) makes
// run() give up, so the serial pass answers instead, with the same figures.
#include "core/analysis_parallel.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cachealloc/analyzer/detail/flat_hash.hpp"

namespace cachealloc::analyzer::parallel {

using snapshot::BlockState;
using snapshot::Event;
using snapshot::EventKind;
using snapshot::Segment;
using snapshot::StackId;
using snapshot::StringId;

namespace {

// An active block: allocated, or freed and pending.
struct ActiveBlock {
  std::uint64_t size = 0;
  std::uint64_t requested = 0;
  StackId stack{};
  bool pending = false;
};

struct SegmentInfo {
  std::uint64_t total_size = 0;
  std::uint64_t stream = 0;
  bool large_pool = false;
  StackId stack{};
};

// What one range does to one block address.
struct BlockChange {
  std::uint64_t address = 0;
  // The range freed or released the block that was at the address when it
  // began, which must then be there.
  bool uses_incoming = false;
  // absent with !uses_incoming: allocated and freed inside the range, no
  // change at all (the builder reuses such records).
  enum class Final : std::uint8_t { absent, active, incoming_pending } final = Final::absent;
  ActiveBlock block;  // when final == active
};

// What one range does to one segment address.
struct SegmentChange {
  std::uint64_t address = 0;
  bool uses_incoming = false;  // released the segment that was there
  bool present = false;
  SegmentInfo info;  // when present
};

// A range's effect: its changes in the order first made, and its annotations.
struct Effect {
  std::vector<BlockChange> blocks;
  std::vector<SegmentChange> segments;
  std::vector<Event> annotations;
  bool explained = true;  // false: an event the effect could not explain, or expandable memory
};

class EffectBuilder {
 public:
  explicit EffectBuilder(std::int32_t device) : device_(device) {}

  // false once the range holds something the parallel pass does not cover.
  bool add(const Event& e) {
    if (e.kind == EventKind::annotation_begin || e.kind == EventKind::annotation_end) {
      effect_.annotations.push_back(e);
      return true;
    }
    if (e.device != device_) return true;
    switch (e.kind) {
      case EventKind::alloc: {
        BlockChange& c = block(e.address);
        if (c.final != BlockChange::Final::absent) return fail();
        c.final = BlockChange::Final::active;
        c.block = ActiveBlock{e.size, e.aux, e.stack, false};
        return true;
      }
      case EventKind::free_requested: {
        BlockChange& c = block(e.address, true);
        if (c.final == BlockChange::Final::active) c.block.pending = true;
        else if (c.final == BlockChange::Final::absent) return fail();
        return true;
      }
      case EventKind::free_completed: {
        BlockChange& c = block(e.address, true);
        if (c.final == BlockChange::Final::absent) return fail();
        c.final = BlockChange::Final::absent;
        // A block born and gone inside the range changes nothing: drop its
        // record, so that the index holds about the live blocks, not every
        // address the range ever used (a lookup in an index of every address
        // missed the cache: 45-60 ns per event on a 2-core x86 machine).
        if (!c.uses_incoming) {
          const auto id = static_cast<std::uint32_t>(&c - effect_.blocks.data());
          block_index_.erase(e.address);
          spare_blocks_.push_back(id);
        }
        return true;
      }
      case EventKind::segment_alloc: {
        if ((e.aux & snapshot::segment_flag_expandable) != 0 || e.size == 0) return fail();
        SegmentChange& c = segment(e.address, false);
        if (c.present) return fail();
        c.present = true;
        c.info = SegmentInfo{e.size, e.stream, (e.aux & snapshot::segment_flag_large_pool) != 0, e.stack};
        return true;
      }
      case EventKind::segment_release: {
        SegmentChange& c = segment(e.address, true);
        if (!c.present) return fail();
        c.present = false;
        return true;
      }
      case EventKind::segment_map:
      case EventKind::segment_unmap:
        return fail();
      default:
        return true;
    }
  }
  Effect take() { return std::move(effect_); }

 private:
  bool fail() {
    effect_.explained = false;
    return false;
  }
  // The change at `address`; a new one says whether it starts from the
  // block there before the range (a free of it) or from none (an alloc).
  BlockChange& block(std::uint64_t address, bool from_incoming = false) {
    const std::uint32_t found = block_index_.find(address);
    if (found != detail::FlatHashMap::kMissing) return effect_.blocks[found];
    std::uint32_t id;
    if (!spare_blocks_.empty()) {
      id = spare_blocks_.back();
      spare_blocks_.pop_back();
      effect_.blocks[id] = BlockChange{};
    } else {
      id = static_cast<std::uint32_t>(effect_.blocks.size());
      effect_.blocks.emplace_back();
    }
    block_index_.insert(address, id);
    BlockChange& c = effect_.blocks[id];
    c.address = address;
    if (from_incoming) {
      c.uses_incoming = true;
      c.final = BlockChange::Final::incoming_pending;
    }
    return c;
  }
  SegmentChange& segment(std::uint64_t address, bool from_incoming) {
    const std::uint32_t found = segment_index_.find(address);
    if (found != detail::FlatHashMap::kMissing) return effect_.segments[found];
    segment_index_.insert(address, static_cast<std::uint32_t>(effect_.segments.size()));
    SegmentChange& c = effect_.segments.emplace_back();
    c.address = address;
    c.uses_incoming = from_incoming;
    c.present = from_incoming;
    return c;
  }

  std::int32_t device_;
  Effect effect_;
  std::vector<std::uint32_t> spare_blocks_;  // records of blocks born and gone in the range
  detail::FlatHashMap block_index_;
  detail::FlatHashMap segment_index_;
};

// The state between ranges: active blocks and segments by address, and the
// open annotations.
class State {
 public:
  // From a layout; false when it is not one the effects can continue
  // (expandable segments, free blocks not merged or carrying a stack).
  bool load(const std::vector<Segment>& layout, std::int32_t device) {
    for (const Segment& segment : layout) {
      if (segment.device != device || segment.total_size == 0) continue;
      if (segment.expandable || segments_.count(segment.address) != 0) return false;
      segments_[segment.address] = SegmentInfo{segment.total_size, segment.stream, segment.large_pool, segment.stack};
      // The blocks must tile the segment in address order, as a file's
      // layouts do (an in-memory Snapshot's need not): Replay::load takes
      // the listed blocks as they are, this state the gaps between active
      // ones.
      bool previous_free = false;
      std::uint64_t at = segment.address;
      for (const snapshot::Block& b : segment.blocks) {
        const bool free = b.state == BlockState::inactive;
        if (b.state == BlockState::unmapped || (free && (previous_free || b.requested != 0 || b.stack != StackId{})))
          return false;
        if (b.address != at || b.size == 0 || b.size > segment.address + segment.total_size - at) return false;
        at += b.size;
        previous_free = free;
        if (!free) blocks_[b.address] = ActiveBlock{b.size, b.requested, b.stack, b.state == BlockState::active_pending_free};
      }
      if (!segment.blocks.empty() && at != segment.address + segment.total_size) return false;
    }
    return true;
  }

  // false when the effect does not fit the state.
  bool apply(const Effect& effect) {
    for (const SegmentChange& c : effect.segments) {
      const auto it = segments_.find(c.address);
      if (c.uses_incoming) {
        if (it == segments_.end()) return false;
        segments_.erase(it);
      } else if (it != segments_.end()) {
        return false;
      }
      if (c.present) segments_[c.address] = c.info;
    }
    for (const BlockChange& c : effect.blocks) {
      if (!c.uses_incoming && c.final == BlockChange::Final::absent) continue;  // no change
      const auto it = blocks_.find(c.address);
      if (c.uses_incoming) {
        if (it == blocks_.end()) return false;
        if (c.final == BlockChange::Final::incoming_pending) {
          it->second.pending = true;
          continue;
        }
        blocks_.erase(it);
      } else if (it != blocks_.end()) {
        return false;
      }
      if (c.final == BlockChange::Final::active) blocks_[c.address] = c.block;
    }
    for (const Event& e : effect.annotations) {
      const StringId name{static_cast<std::uint32_t>(e.aux)};
      if (e.kind == EventKind::annotation_begin) {
        annotations_.push_back(name);
      } else {
        // As Replay::on_annotation_end: the innermost open one of that name.
        for (auto it = annotations_.rbegin(); it != annotations_.rend(); ++it) {
          if (*it == name) {
            annotations_.erase(std::next(it).base());
            break;
          }
        }
      }
    }
    return true;
  }

  // The layout now, free blocks filling the gaps; nullopt when an active
  // block lies outside every segment or overlaps another.
  std::optional<std::vector<Segment>> layout(std::int32_t device) const {
    std::vector<std::pair<std::uint64_t, const SegmentInfo*>> segments;
    segments.reserve(segments_.size());
    for (const auto& [address, info] : segments_) segments.emplace_back(address, &info);
    std::sort(segments.begin(), segments.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<std::pair<std::uint64_t, const ActiveBlock*>> blocks;
    blocks.reserve(blocks_.size());
    for (const auto& [address, block] : blocks_) blocks.emplace_back(address, &block);
    std::sort(blocks.begin(), blocks.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<Segment> result;
    result.reserve(segments.size());
    std::size_t next = 0;
    std::uint64_t previous_end = 0;
    for (const auto& [address, info] : segments) {
      // Segments that overlap (a damaged trace; Replay finds a block's
      // segment by its own history there) are not a state to start from.
      if (address < previous_end || info->total_size > UINT64_MAX - address) return std::nullopt;
      previous_end = address + info->total_size;
      if (next < blocks.size() && blocks[next].first < address) return std::nullopt;
      Segment segment{device, info->stream, address, info->total_size, info->large_pool, false, info->stack, {}};
      const std::uint64_t end = address + info->total_size;
      std::uint64_t at = address;
      for (; next < blocks.size() && blocks[next].first < end; ++next) {
        const std::uint64_t start = blocks[next].first;
        const ActiveBlock& b = *blocks[next].second;
        if (start < at || b.size == 0 || b.size > end - start) return std::nullopt;
        if (start > at) segment.blocks.push_back(snapshot::Block{at, start - at, 0, BlockState::inactive, {}});
        segment.blocks.push_back(snapshot::Block{
            start, b.size, b.requested, b.pending ? BlockState::active_pending_free : BlockState::active_allocated,
            b.stack});
        at = start + b.size;
      }
      if (at < end) segment.blocks.push_back(snapshot::Block{at, end - at, 0, BlockState::inactive, {}});
      result.push_back(std::move(segment));
    }
    if (next != blocks.size()) return std::nullopt;
    return result;
  }

  const std::vector<StringId>& annotations() const noexcept { return annotations_; }

 private:
  std::unordered_map<std::uint64_t, SegmentInfo> segments_;
  std::unordered_map<std::uint64_t, ActiveBlock> blocks_;
  std::vector<StringId> annotations_;
};

// One range's pass, kept until the merge.
struct RangePass {
  std::size_t first_block = 0, end_block = 0;
  std::size_t first_event = 0, end_event = 0;
  std::unique_ptr<EventSource> source;
  std::optional<Replay> replay;
  Analysis part;
  std::optional<pass::WindowPass> pass;
  std::exception_ptr error;
};

// Keeps the peak that is higher, or, at the same height, reached first.
void merge_peak(Peak& into, std::size_t& winner, const Peak& candidate, std::size_t index) {
  if (candidate.event != kNoEvent && candidate.bytes > into.bytes) {
    into = candidate;
    winner = index;
  }
}

}  // namespace

// The first event at or after block `block` (forward), or the last before
// it (backward).
std::optional<Event> event_near(EventSource& source, std::size_t block, bool forward) {
  if (forward) {
    for (std::size_t b = block; b < source.block_count(); ++b) {
      const std::span<const Event> events = source.block(b);
      if (!events.empty()) return events.front();
    }
  } else {
    for (std::size_t b = block; b-- > 0;) {
      const std::span<const Event> events = source.block(b);
      if (!events.empty()) return events.back();
    }
  }
  return std::nullopt;
}

bool run(EventSource& source, const AnalysisOptions& options, const InitialLayout& initial, unsigned threads,
         Analysis& a, const Finish& finish) {
  const std::size_t n = source.event_count();
  const std::size_t blocks = source.block_count();
  if (threads < 2 || blocks < 2 || options.timeline == AnalysisOptions::Timeline::per_event || a.window.begin != 0 ||
      a.window.end != n) {
    return false;
  }
  State state;
  if (!state.load(initial.segments, a.device)) return false;
  const std::size_t stacks = source.head().stacks.size();
  // Per-site counters cost about 100 bytes per stack and thread: keep them
  // under 1 GiB.
  const std::size_t by_memory = std::max<std::size_t>(1, (std::size_t{1} << 30) / std::max<std::size_t>(1, stacks * 100));
  const std::size_t ranges = std::min<std::size_t>({threads, blocks, by_memory});
  if (ranges < 2) return false;

  std::vector<RangePass> passes(ranges);
  for (std::size_t k = 0; k < ranges; ++k) {
    RangePass& r = passes[k];
    r.first_block = k * blocks / ranges;
    r.end_block = (k + 1) * blocks / ranges;
    r.first_event = source.block_begin(r.first_block);
    r.end_event = source.block_begin(r.end_block);
    try {
      r.source = source.open_another();
    } catch (...) {  // the file cannot be opened again (gone, out of descriptors): one thread reads it
      return false;
    }
    if (!r.source) return false;
  }

  std::atomic<std::size_t> done{0};  // events of the passes done, for progress
  std::atomic<bool> give_up{false};
  auto run_pass = [&](RangePass& r, std::size_t k, std::vector<Segment> layout, std::vector<StringId> open) {
    try {
      r.replay.emplace(layout, a.device, stacks);
      layout.clear();
      r.replay->resume_at(r.first_event, std::move(open));
      r.part.device = a.device;
      r.part.window = a.window;
      r.part.sites.resize(stacks);
      r.pass.emplace(options, r.part, *r.replay);
      // The events either side of the range, copied before the range's own
      // blocks are read (a block's span lasts until the next read).
      std::optional<Event> previous;
      if (k > 0) previous = event_near(*r.source, r.first_block, false);
      for (std::size_t b = r.first_block; b < r.end_block; ++b) {
        if (give_up.load(std::memory_order_relaxed)) return;
        const std::span<const Event> events = r.source->block(b);
        const std::size_t base = r.source->block_begin(b);
        if (b == r.first_block) {
          if (k == 0) {
            r.part.time_origin_ns = events.empty() ? 0 : events.front().time_ns;
            r.pass->start_window(r.part.time_origin_ns);
          } else {
            r.pass->start_range(r.first_event, !events.empty() && previous &&
                                                   pass::WindowPass::plain_free_pair(*previous, events.front(), a.device));
          }
        }
        for (std::size_t j = 0; j < events.size(); ++j) r.pass->step(base + j, events[j]);
        done.fetch_add(events.size(), std::memory_order_relaxed);
        if (r.replay->anomalies().total() != 0 || r.replay->overlapping_segments() != 0) break;
      }
      if (r.replay->anomalies().total() != 0 || r.replay->overlapping_segments() != 0) {
        give_up = true;
        return;
      }
      if (k + 1 < passes.size()) {
        const std::optional<Event> next = event_near(*r.source, r.end_block, true);
        if (next) {
          r.pass->end_range(r.end_event, *next);
        } else {
          r.pass->end_window();
        }
      } else {
        r.pass->end_window();
      }
    } catch (...) {
      r.error = std::current_exception();
      give_up = true;
    }
  };

  // Thread k > 0 reads range k - 1 and builds its effect, then, once the
  // calling thread has the states, runs the pass of range k; thread 0 runs
  // the first range's pass at once. (Keeping the events the effect decoded
  // for the pass costs more than decoding them again: the page faults of a
  // buffer that size; docs/PERFORMANCE.md, "What limits the figures".)
  std::vector<Effect> effects(ranges - 1);
  std::vector<std::vector<Segment>> starts(ranges);
  std::vector<std::vector<StringId>> open_at(ranges);
  std::mutex mutex;
  std::condition_variable changed;
  std::size_t effects_done = 0, passes_done = 0;
  bool states_ready = false;

  auto work = [&](std::size_t k) {
    RangePass& r = passes[k];
    if (k > 0) {
      try {
        EffectBuilder builder(a.device);
        for (std::size_t b = passes[k - 1].first_block; b < passes[k - 1].end_block && !give_up; ++b) {
          for (const Event& e : r.source->block(b)) {
            if (!builder.add(e)) {
              give_up = true;
              break;
            }
          }
        }
        effects[k - 1] = builder.take();
      } catch (...) {
        r.error = std::current_exception();
        give_up = true;
      }
    }
    {
      std::unique_lock<std::mutex> lock(mutex);
      ++effects_done;
      changed.notify_all();
      if (k > 0) changed.wait(lock, [&] { return states_ready; });
    }
    if (!give_up) run_pass(r, k, k == 0 ? initial.segments : std::move(starts[k]), std::move(open_at[k]));
    const std::lock_guard<std::mutex> lock(mutex);
    ++passes_done;
    changed.notify_all();
  };

  std::vector<std::thread> workers;
  workers.reserve(ranges);
  for (std::size_t k = 0; k < ranges; ++k) {
    try {
      workers.emplace_back(work, k);
    } catch (...) {
      // No thread to be had: the ones started finish as soon as they can.
      give_up = true;
      const std::lock_guard<std::mutex> lock(mutex);
      effects_done += ranges - k;  // each thread counts once
      passes_done += ranges - k;
      states_ready = true;
      changed.notify_all();
      break;
    }
  }
  // Nothing may leave this thread while the workers run (a joinable
  // std::thread destroyed is std::terminate): an exception here (the
  // progress callback's, no memory for the states) is kept, the workers are
  // told to stop, and it is rethrown once they are joined.
  std::exception_ptr error_here;
  auto report = [&](std::unique_lock<std::mutex>& lock) {
    if (!options.progress || error_here) return;
    lock.unlock();
    try {
      options.progress(std::min(done.load(std::memory_order_relaxed), n), n);
    } catch (...) {
      error_here = std::current_exception();
      give_up = true;
    }
    lock.lock();
  };
  {
    std::unique_lock<std::mutex> lock(mutex);
    while (effects_done < ranges) {
      changed.wait_for(lock, std::chrono::milliseconds(100));
      report(lock);
    }
    if (!give_up) {
      // Step 2: the state at each range's start.
      lock.unlock();
      try {
        for (std::size_t k = 1; k < ranges && !give_up; ++k) {
          std::optional<std::vector<Segment>> layout;
          if (state.apply(effects[k - 1])) layout = state.layout(a.device);
          effects[k - 1] = Effect{};
          if (!layout) {
            give_up = true;
            break;
          }
          starts[k] = std::move(*layout);
          open_at[k] = state.annotations();
        }
      } catch (...) {
        error_here = std::current_exception();
        give_up = true;
      }
      lock.lock();
    }
    states_ready = true;
    changed.notify_all();
    while (passes_done < ranges) {
      changed.wait_for(lock, std::chrono::milliseconds(100));
      report(lock);
    }
  }
  for (std::thread& worker : workers) worker.join();
  if (error_here) std::rethrow_exception(error_here);
  if (give_up) return false;

  // The merge, in event order.
  Analysis& first = passes.front().part;
  a.time_origin_ns = first.time_origin_ns;
  a.totals_at_start = first.totals_at_start;
  a.cache_at_start = first.cache_at_start;
  a.peak_allocated = first.peak_allocated;
  a.peak_reserved = first.peak_reserved;
  a.peak_active = first.peak_active;
  a.peak_requested = first.peak_requested;
  a.peak_inactive_split = first.peak_inactive_split;
  a.peak_segments = 0;
  std::size_t allocated_winner = 0, reserved_winner = 0, unused = 0;
  TimelineRow row;
  bool row_open = false;
  for (std::size_t k = 0; k < ranges; ++k) {
    const Analysis& part = passes[k].part;
    for (std::size_t c = 0; c < a.counts.size(); ++c) a.counts[c] += part.counts[c];
    for (std::size_t s = 0; s < part.sites.size() && s < a.sites.size(); ++s) {
      a.sites[s].allocs += part.sites[s].allocs;
      a.sites[s].alloc_bytes += part.sites[s].alloc_bytes;
      a.sites[s].requested_bytes += part.sites[s].requested_bytes;
    }
    a.ooms.insert(a.ooms.end(), part.ooms.begin(), part.ooms.end());
    a.peak_segments = std::max(a.peak_segments, part.peak_segments);
    if (k > 0) {
      merge_peak(a.peak_allocated, allocated_winner, part.peak_allocated, k);
      merge_peak(a.peak_reserved, reserved_winner, part.peak_reserved, k);
      merge_peak(a.peak_active, unused, part.peak_active, k);
      merge_peak(a.peak_requested, unused, part.peak_requested, k);
      merge_peak(a.peak_inactive_split, unused, part.peak_inactive_split, k);
    }
    // Timeline rows: a part that goes on in the next range merges with it.
    const std::vector<std::uint8_t>& complete = passes[k].pass->row_complete();
    for (std::size_t r = 0; r < part.timeline.size(); ++r) {
      const TimelineRow& piece = part.timeline[r];
      if (!row_open) {
        row = piece;
      } else {
        pass::grow_max(row.max, piece.max);
        row.last_event = piece.last_event;
        row.time_ns = piece.time_ns;
        row.kind = piece.kind;
        row.at_end = piece.at_end;
        row.cache = piece.cache;
      }
      row_open = complete[r] == 0;
      if (!row_open) a.timeline.push_back(row);
    }
  }
  if (row_open) a.timeline.push_back(row);

  // The largest free block at the reserved peak: after the call that
  // reached it, which may end in the next range.
  RangePass& winner = passes[reserved_winner];
  if (winner.pass->peak_cache_pending()) {
    bool pending = true;
    for (std::size_t b = winner.end_block; pending && b < blocks; ++b) {
      for (const Event& e : winner.source->block(b)) {
        if (!(pending = winner.pass->settle_with(e))) break;
      }
    }
    winner.pass->finish();
  }
  a.cache_at_peak_reserved = winner.part.cache_at_peak_reserved;

  // The serial pass ends with a per-site entry for every stack any alloc
  // named (Replay grows its counters for ids past the table); each range's
  // Replay grew only for its own.
  for (const RangePass& r : passes) {
    if (a.sites.size() < r.replay->live_bytes_by_stack().size()) a.sites.resize(r.replay->live_bytes_by_stack().size());
  }
  a.threads = static_cast<unsigned>(ranges);
  RangePass& last = passes.back();
  if (options.progress) options.progress(n, n);
  finish(a, *last.replay, passes[allocated_winner].pass->at_peak_allocated, winner.pass->at_peak_reserved);
  return true;
}

}  // namespace cachealloc::analyzer::parallel
